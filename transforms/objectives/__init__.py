"""Pure numpy implementations of the pretraining objectives and the helpers both the
Beam pipeline and the torch loader need (key digests, seeding, packing).

Only numpy and the standard library may be imported here (docs/design.md section 1), and
:mod:`schemas.errors` inside the registry's function that refuses a plugin (the schemas
package imports pyarrow, which importing the objectives never loads).
"""
