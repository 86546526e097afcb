"""Draft logits of an EAGLE-1/2 head computed by the official EAGLE package (eagle-llm,
``eagle.model.cnets.Model``), run in the eagle-llm side venv.

Request: target and head folders, the prompt, the target's first token and the draft tokens to
feed back. Answer: ``logits`` [depth, V] (the target's lm_head over the head's output at each
draft depth) and ``argmax`` [depth]. Weights are loaded the way the package's own ``EaModel``
does (strict=False), so missing or unexpected keys are reported here instead.

The package was written for transformers 4, where a null ``rope_scaling`` stays None; under
transformers 5 the config turns it into a dict without the ``type`` key the package indexes, so
a null in config.json is restored to None before the model is built. The package also ignores
``rope_theta`` (its rotary base is always 10000).
"""

from __future__ import annotations

import sys

import torch
from common import head_config, head_weights, read_request, target_hidden_states, write_answer
from eagle.model.cnets import Model
from eagle.model.configs import EConfig


def main() -> None:
    request, inputs = read_request()
    prompt, first, drafts = inputs["prompt_ids"], inputs["first_token"], inputs["draft_tokens"]
    target, hidden_states = target_hidden_states(request["target"], prompt)
    raw_config = head_config(request["head"])
    config = EConfig.from_pretrained(request["head"])
    if raw_config.get("rope_scaling") is None:
        config.rope_scaling = None
    head = Model(config, load_emb=False, bias=raw_config.get("bias", True)).eval()
    weights = head_weights(request["head"])
    missing, unexpected = head.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k != "embed_tokens.weight"]
    if missing or unexpected:
        sys.exit(f"official EAGLE head: missing keys {missing}, unexpected keys {unexpected}")
    if "embed_tokens.weight" not in weights:  # EaModel loads the target's in that case
        embedding = target.get_input_embeddings().weight.detach().float().clone()
        head.embed_tokens.weight.data = embedding

    features = hidden_states[-1]  # the target's final normed hidden state, [1, n, H]
    shifted = torch.cat([prompt[1:], first])[None]  # head position t reads token t+1
    logits = []
    with torch.no_grad():
        out, past = head(features, shifted, use_cache=True)
        hidden = out[:, -1:]
        logits.append(target.lm_head(hidden)[0, -1])
        for token in drafts:
            out, past = head(hidden, token.view(1, 1), past_key_values=past, use_cache=True)
            hidden = out[:, -1:]
            logits.append(target.lm_head(hidden)[0, -1])
    stacked = torch.stack(logits)
    write_answer({"logits": stacked, "argmax": stacked.argmax(-1)})


if __name__ == "__main__":
    main()
