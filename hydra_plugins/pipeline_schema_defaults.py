"""The schema's defaults for DVC's own composition of conf/ (`dvc exp run -S ...`): DVC loads
Hydra's plugins from the repository's root before it composes, which runs this module, and
conf/config.yaml's defaults list starts with what it registers (pipeline.config does the
same for its own compositions)."""

from pipeline.config import register_schema_defaults

register_schema_defaults()
