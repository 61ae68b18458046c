"""Moses pre-tokenization (pipeline.data.moses) against the Multi30k dataset's own tokenized
text (its scripts/task1-tokenize.sh with the Moses perl scripts) and against sacremoses called
step by step; what benchmarks.fairseq.train_peer and `data.tokenizer.pretokenizer: moses` apply."""

from __future__ import annotations

import pytest
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from pipeline.data.corpus import normalize, read_lines
from pipeline.data.moses import moses_detokenize, moses_tokenize
from pipeline.evaluation.scoring import score

# Lines of multi30k/dataset data/task1/tok/test_2016_flickr.lc.norm.tok.de (made by its
# scripts/task1-tokenize.sh with Moses 3a0631a), by 1-based line number of the raw file.
OFFICIAL_TOK_DE = {
    1: "ein mann mit einem orangefarbenen hut , der etwas anstarrt .",
    2: "ein boston terrier läuft über saftig-grünes gras vor einem weißen zaun .",
    226: "eine frau auf einem boot namens &quot; el corazon &quot; lässt schwarze gewichte ins "
    "wasser fallen .",
    230: "ein jugendlicher in einem schwarzen t-shirt mit dem aufdruck &quot; asian pacific 2007 "
    "&quot; sitzt und spielt eine trommel .",
    457: "eine frau hält einen großen scheck für &quot; kids &apos; food basket &quot; .",
}


def test_moses_tokenize_equals_task1_tokenize_output(multi30k_dir):
    """Lowercase + sacremoses normalise + tokenize reproduces the dataset's own tokenized
    references: escaping on (&quot;, &apos;), hyphenated words kept whole (no `-a`)."""
    raw = read_lines(multi30k_dir / "test_2016_flickr.de.gz")
    lines = [raw[number - 1] for number in OFFICIAL_TOK_DE]
    assert moses_tokenize(lines, "de") == list(OFFICIAL_TOK_DE.values())


@pytest.mark.parametrize("lang", ["en", "de"])
def test_moses_tokenize_is_lowercase_normalise_tokenize_step_by_step(multi30k_dir, lang):
    """Real training lines, among them every one with a quote the normaliser rewrites, go
    through exactly lower() -> MosesPunctNormalizer(perl_parity) -> MosesTokenizer; without
    `lowercase` the same minus lower()."""
    raw = read_lines(multi30k_dir / f"train.{lang}.gz")
    quotes = [line for line in raw if any(c in line for c in "„“”’‘`\"'")]
    lines = raw[:50] + quotes[:200]
    normalizer = MosesPunctNormalizer(lang=lang, perl_parity=True)
    tokenizer = MosesTokenizer(lang=lang)
    for lowercase in (True, False):
        expected = []
        for line in lines:
            cased = line.lower() if lowercase else line
            normalised = normalizer.normalize(cased)
            expected.append(tokenizer.tokenize(normalised, escape=True, return_str=True))
        tokenized = moses_tokenize(lines, lang, lowercase=lowercase)
        assert tokenized == expected
        assert all(t == t.lower() for t in tokenized) == lowercase
        assert not any(c in t for t in tokenized for c in '„“”"')  # normalised, then escaped


def test_perl_parity_lone_right_quote():
    """normalize-punctuation.perl turns a lone ’ into '"' (sacremoses only with perl_parity);
    Multi30k's train.de has one such line ("Hook ’em Horns")."""
    (tokenized,) = moses_tokenize(["Das „Hook ’em Horns“-Zeichen."], "de")
    assert "&quot; em horns" in tokenized


def test_detokenized_reference_scores_100_with_our_scoring(multi30k_dir):
    """Tokenized text -> sacremoses detokenizer -> this project's scoring is lossless: the
    references themselves, round-tripped as a pre-tokenized model's output is, score 100."""
    references = [normalize(r) for r in read_lines(multi30k_dir / "test_2016_flickr.de.gz")]
    tokenized = moses_tokenize(references[:300], "de")
    result = score(moses_detokenize(tokenized, "de"), references[:300], lang="de")
    assert result["bleu_tok_lc"] == pytest.approx(100.0)
    assert result["bleu_lc"] == pytest.approx(100.0)
