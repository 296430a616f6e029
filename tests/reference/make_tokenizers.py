#!/usr/bin/env python3
"""Writes the small byte-level BPE tokenizer.json files the tokenizer tests read (tests/data/).

A BPE is trained here, plain Python, on a few lines of text in several scripts, then written in the
shapes GPT-2, Llama 3 and SmolLM's files have: the same vocabulary and merges under their
pre-tokenizers, merge forms, added tokens and post-processors. The ids the tests expect were
computed from these files by an independent implementation (HF's tokenizers.js), not by tshard.

    python3 tests/reference/make_tokenizers.py tests/data
"""
import collections, json, os, re, sys

CORPUS = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs!
In 2024 the model read 1234567 tokens, then 89 more: it's what they'll say we've done.
Grüße aus München: Übergrößenträger äßen Käse. Ça va très bien, merci à vous.
Καλημέρα κόσμε, ένα δύο τρία. Привет, мир! Съешь же ещё этих мягких французских булок.
東京は日本の首都です。北京是中国的首都。 emoji 🙂 and tabs\tand  double  spaces.
    indented code: def f(x): return x ** 2  # square
"""

def byte_alphabet():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

def train(merges_wanted):
    alphabet = byte_alphabet()
    words = collections.Counter(
        "".join(alphabet[b] for b in w.encode("utf-8"))
        for w in re.findall(r"\s?\w+|\s?[^\w\s]+|\s+", CORPUS * 3))
    vocab = {alphabet[b]: i for i, b in enumerate(sorted(alphabet, key=lambda b: ord(alphabet[b])))}
    split = {w: list(w) for w in words}
    merges = []
    while len(merges) < merges_wanted:
        pairs = collections.Counter()
        for w, n in words.items():
            s = split[w]
            for a, b in zip(s, s[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
        for w in words:
            s, out, i = split[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            split[w] = out
    return vocab, merges

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

def added(vocab):
    n = len(vocab)
    return [
        {"id": n, "content": "<|begin_of_text|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
        {"id": n + 1, "content": "<|end_of_text|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
        {"id": n + 2, "content": "<|eot_id|>", "single_word": False, "lstrip": True, "rstrip": True, "normalized": False, "special": True},
        {"id": n + 3, "content": "<|end|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
    ]

def tokenizer(vocab, merges, kind):
    bpe = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": kind == "llama3",
           "vocab": vocab}
    byte_level = {"type": "ByteLevel", "add_prefix_space": kind == "prefix", "trim_offsets": True, "use_regex": True}
    if kind in ("gpt2", "prefix"):
        pre, bpe["merges"], post = byte_level, [a + " " + b for a, b in merges], {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    elif kind == "llama3":
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            dict(byte_level, use_regex=False)]}
        bpe["merges"] = [[a, b] for a, b in merges]
        post = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [len(vocab)], "tokens": ["<|begin_of_text|>"]}}}]}
    else:  # smollm: digits one by one, then GPT-2's pattern
        pre = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
        bpe["merges"], post = [a + " " + b for a, b in merges], None
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added(vocab), "normalizer": None,
            "pre_tokenizer": pre, "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}, "model": bpe}

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    vocab, merges = train(300)
    for kind in ("gpt2", "prefix", "llama3", "smollm"):
        with open(os.path.join(out, f"tokenizer_{kind}.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer(vocab, merges, kind), f, ensure_ascii=False, indent=1)
