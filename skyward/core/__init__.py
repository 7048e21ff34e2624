"""The pool's core: functions and operators, opening pools, and the live pool's parts
(membership, dispatch, batches, healing, streaming). See docs/how-it-works.md."""
