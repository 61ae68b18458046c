"""Export a trained model for use outside the pipeline: CTranslate2 (a C++ inference engine).

    python -m pipeline.export --to ctranslate2 --checkpoint eval/model.ckpt \\
        --tokenizer data/tokenized/spm.model --out exported/ct2 [--quantization int8]

The checkpoint is the one the evaluate stage writes (`eval/model.ckpt`, the averaged weights)
or any training checkpoint. `--out` becomes a CTranslate2 model folder (`model.bin`,
`config.json`, `shared_vocabulary.json`, or source and target vocabularies when the embeddings
are not tied) plus the subword model (`spm.model`) and `export.json` (the checkpoint, the
weight type, `source_eos`, `max_positions`), so that the folder alone translates:

    translator = ctranslate2.Translator("exported/ct2")
    sp = sentencepiece.SentencePieceProcessor(model_file="exported/ct2/spm.model")
    result = translator.translate_batch([sp.encode("A dog runs.", out_type=str)], beam_size=5)
    print(sp.decode(result[0].hypotheses[0]))

A model trained on Moses-tokenized text (`data.tokenizer.pretokenizer: moses`) is exported with
its pre-tokenization: `spm.pretokenizer.json` beside `spm.model` (which `load_exported` and
`Tokenizer.load` read) and the same record as `pretokenizer` in export.json. Outside this
package, text then goes through sacremoses as `pipeline.data.moses` does before `sp.encode`
(`moses_tokenize(lines, src_lang, lowercase=...)`) and after `sp.decode`
(`moses_detokenize(lines, tgt_lang)`). A model on subword-nmt's BPE (`data.tokenizer.model_type:
subword_nmt`) carries its merges and vocabularies too (`spm.bpe-codes`, `spm.bpe-vocab.src`,
`spm.bpe-vocab.tgt`, `pipeline.data.subword_nmt`): outside this package text goes through
`subword-nmt apply-bpe -c spm.bpe-codes --vocabulary spm.bpe-vocab.src` after Moses, and the
`@@ ` joiners are removed after `sp.decode`.

The package: `conversion` (our Transformer as CTranslate2's model spec, written as a folder),
`translation` (an exported folder loaded and decoded as our beam search decodes), `command`
(`python -m pipeline.export`, `transformer-export`). The names below are its public API.
"""

from pipeline.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "command": ["console", "export", "load_checkpoint"],
        "conversion": ["DEFAULT_QUANTIZATION", "EXPORT_INFO", "check_tokenizer",
                       "export_ctranslate2", "transformer_spec"],
        "translation": ["ExportedModel", "load_exported", "max_output_length",
                        "nbest_with_ctranslate2", "score_with_ctranslate2",
                        "translate_with_ctranslate2"],
    },
)  # fmt: skip
