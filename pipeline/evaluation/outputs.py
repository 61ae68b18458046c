"""The names of what the evaluate stage writes, import-light (no torch): the translate CLI
resolves its default checkpoint from here at once."""

# In paths.eval_dir: the (averaged) weights the stage scored; translate's default.
MODEL_CHECKPOINT = "model.ckpt"
EVAL_METRICS_FILE = "eval.json"  # in paths.metrics_dir
ATTENTION_DIR = "attention"  # in paths.plots_dir
