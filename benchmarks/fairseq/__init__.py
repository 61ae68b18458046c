"""The fairseq harness: fairseq 0.12 beside this pipeline, one module per job.

- `train_peer`: Wu et al.'s recipe run by fairseq itself (its venv, data, training, decoding,
  scoring), a result in `results/parity/`;
- `step_speed`: fairseq's training step as a worker that `benchmarks.train_throughput` times;
- `lockstep_check`: ours and fairseq trained from the same weights on the same batches;
- `decode_checkpoint`: one model of ours decoded by our beam search and by fairseq's;
- `wu2021_segmentation`: the overrides under which ours reads the harness's segmented files;
- `parity`: the generated parity table of docs/parity.md, its comparisons (docs/parity-comparisons.md) and `parity.png`;
- `val_loss_curves`: validation loss of both systems at fairseq's updates.

Modules that run inside fairseq's venv import only the standard library and torch at module
level, and this file imports nothing.
"""
