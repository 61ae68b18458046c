"""Moses tokenization (Koehn et al. 2007) as the Multi30k literature applies it, through
sacremoses, the Python port of the Moses perl scripts: one place for the settings.

    scripts/task1-tokenize.sh of the Multi30k dataset (Moses 3a0631a):
        lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl -l L
    = moses_tokenize(lines, L)             escaping on (" -> &quot;, ' -> &apos;, ...), no -a
    detokenizer.perl -l L = moses_detokenize(lines, L)       unescapes, joins the tokens

`normalize-punctuation.perl` turns a lone right quote (Multi30k's "Hook ’em Horns") into '"';
sacremoses' normaliser does so only with `perl_parity`. The defaults are task1-tokenize.sh's,
which Wu et al. (2021) train on (`data.tokenizer.pretokenizer: moses`, `benchmarks.fairseq.train_peer`);
the tokenized BLEU of the literature (`pipeline.evaluation.scoring`) tokenizes with other
settings (`-a -no-escape`, sacremoses' own normaliser), passed explicitly.
"""

from __future__ import annotations

from collections.abc import Iterable

# sacremoses is imported where it is used: it compiles its rules on import, a cost every process
# that loads the tokenizer would pay and only a Moses-pretokenized model needs.


def moses_tokenize(
    lines: Iterable[str],
    lang: str,
    *,
    lowercase: bool = True,
    escape: bool = True,
    aggressive_dash_splits: bool = False,
    perl_parity: bool = True,
) -> list[str]:
    """Each line lowercased (`lowercase.perl`), punctuation-normalised
    (`normalize-punctuation.perl -l lang`) and tokenized (`tokenizer.perl -l lang`, `-a` with
    `aggressive_dash_splits`, `-no-escape` without `escape`), tokens joined by single spaces."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer = MosesPunctNormalizer(lang=lang, perl_parity=perl_parity)
    tokenizer = MosesTokenizer(lang=lang)
    return [
        tokenizer.tokenize(
            normalizer.normalize(line.lower() if lowercase else line),
            aggressive_dash_splits=aggressive_dash_splits,
            escape=escape,
            return_str=True,
        )
        for line in lines
    ]


def moses_detokenize(lines: Iterable[str], lang: str) -> list[str]:
    """Moses-tokenized, escaped lines back to plain text (`detokenizer.perl -l lang`)."""
    from sacremoses import MosesDetokenizer

    detokenizer = MosesDetokenizer(lang=lang)
    return [detokenizer.detokenize(line.split(), unescape=True) for line in lines]
