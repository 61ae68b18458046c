"""Ablation report: `python -m pipeline.report <study> [--update-docs]`.

Made from the study's committed files alone (`ablations/results/<study>/`: the finished trials'
records `trials/<variant>-seed<seed>/`, the references, and `study.db` for the trial states), so
that anyone with a clone re-makes it exactly:
- `report.md`: a Table-3 shaped table, one row per variant that ran under the base's run
  conditions (commit, hardware class, precision): what changed, parameters, val perplexity, val
  BLEU (lc) as mean +- std over seeds, test2016 BLEU (lc) as the seed mean and its 95%
  t-interval, the difference to the base, Welch's t-test of that difference over seed-level
  BLEU (the unit is the training run) and its Holm-adjusted p across the study's comparisons,
  the verdict against the paper's direction (from that test only; a 'cannot tell' with the
  difference detectable at its Holm step), the exact permutation test of the same difference
  (distribution-free) and sacreBLEU's paired bootstrap over test sentences as secondary
  columns, and the paper's own Table 3 difference (the spec's `paper` entries, naming where
  the paper's row is not the same change: `paper`); variants run under other conditions in a
  block of their own, never judged against the base; the A/A check on the base's seeds, the
  difference the study can detect at the base's seed spread, one finding per row, a summary
  and, once every planned trial has finished, what differs in prose and the write-ups of
  `literature.yaml` against our runs, all written from the records; with `--transfer`,
  whether each finding holds on each language pair;
- charts (PNG): BLEU per variant (every seed a point, the mean and its t-interval over seeds,
  the verdict under each; "interim, k of n" in the titles while trials run on), perplexity
  against BLEU for the label-smoothing rows, learning curves of val BLEU per variant, the
  heads x width grid where variants set `model.head_dim`;
- `--update-docs`: the study's page docs/ablation-<study>.md, its block between
  `<!-- ablation:<study>:begin -->` and `<!-- ablation:<study>:end -->`, gets the same table
  and findings (a study without a page is an error naming it), README's block
  `ablation:<study>:summary`, where README has one, the table's main columns (its block
  `ablation:<study>:progress`: the progress line, and the verdicts in one sentence once every
  planned trial has finished), and the docs'
  front page's block `ablation:<study>:front`, where it has one, the result in short (a test
  checks that the committed pages equal this command's output);
- one W&B report run in the study's group with the same tables and charts, every comparison's
  verdict in its summary and report.md as an artifact (`--no-wandb` skips).
A search study's report is its trials ranked by the objective.

One job per module: `records` (the finished trials and their run conditions), `rows` (per-variant
statistics, the spec's contrasts between variants, the one Holm family and the verdicts),
`tables` (the Markdown tables and their cells), `contrasts` (the contrasts' table and findings,
and the heads x width grid), `prose` (findings,
summary, A/A check, power, what differs, the write-ups), `paper` (the paper's rows and other write-ups against
our changes), `charts`, `document` (the report's Markdown and report.md), `docs` (the blocks on the docs
site and README), `wandb_summary`, `progress` (a pinned study's progress) and `cli`. The names below are the package's public API.
"""

from pipeline.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "charts": ["CHARTS", "study_state"],
        "contrasts": ["contrast_findings", "extra_tables", "head_shapes", "heads_width_grid",
                      "heads_width_table"],
        "cli": ["cli", "console"],
        "docs": ["SUMMARY_COLUMNS", "block_name", "docs_block", "progress_block", "study_page", "summary_block",
                 "update_docs"],
        "document": ["failed_attempts", "markdown", "paper_column_note", "trial_states",
                     "write_report"],
        "paper": ["WriteUp", "unlike_paper", "write_ups"],
        "progress": ["hours_left", "progress", "study_pin"],
        "prose": ["aa_check", "detectable_text", "differences_paragraph", "findings",
                  "power_statement", "summary", "write_up_paragraph"],
        "records": ["P_METRIC", "TEST_SPLIT", "VAL_SPLIT", "RunConditions", "TrialRecord",
                    "load_records", "run_class", "test_references"],
        "rows": ["BASE_VARIANT", "CANNOT_TELL", "CONTRADICTS", "DIFFERS", "HOLDS", "SIGNIFICANCE",
                 "Comparison", "ContrastRow", "VariantRow", "contrast_rows", "direction_verdict",
                 "family_contrasts", "family_size", "holm_family", "pooled_p_value",
                 "pooled_p_values",
                 "variant_rows", "verdict"],
        "tables": ["INTERIM", "delta_cell", "grid_table", "other_conditions_table", "pair_label",
                   "paper_cell", "p_text", "ppl_note", "ppl_table", "search_table",
                   "transfer_table", "verdict_cell"],
    },
)  # fmt: skip
