"""Evaluation: scoring (sacreBLEU), plots, the evaluate stage; `pipeline.translate` uses it.

Kept import-light (no torch here) so the translate CLI can resolve its defaults and answer a
usage error at once.
"""

# In `paths.eval_dir`: the (averaged) weights the evaluate stage scored; translate's default.
MODEL_CHECKPOINT = "model.ckpt"
