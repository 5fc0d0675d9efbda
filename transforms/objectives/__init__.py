"""Pure numpy implementations of the pretraining objectives and the helpers both the
Beam pipeline and the torch loader need (key digests, seeding, packing).

Only numpy and the standard library may be imported here (docs/design.md section 1), and the
sentence rule :mod:`transforms.tokenizing.text_rules` (itself ``re`` and numpy), which
:mod:`transforms.objectives.bart_noise` shares with Tokenize to find BART's sentences again.
"""
