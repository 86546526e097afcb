"""Draft logits of an EAGLE-3 head computed by SpecForge's model code
(``specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3``), run in the specforge
side venv.

SpecForge has no single-sequence drafting loop on CPU (it serves through SGLang), so this runs
its training-time-test path: step j feeds the head's own outputs back with the tokens shifted by
j, attends to the step-0 keys causally and to its own earlier steps at the same position, at
position t + j. At the last prompt position that is exactly a draft chain. Answer: ``logits``
[depth, Vd] over the draft vocabulary and ``argmax`` [depth].

With ``make_head`` in the request it first saves a random head with SpecForge's own
``save_pretrained`` into the head folder (``draft: false``: only that).
"""

from __future__ import annotations

import sys

import torch
from common import head_config, head_weights, read_request, target_hidden_states, write_answer
from specforge.modeling.draft.llama3_eagle import (
    LlamaForCausalLMEagle3,
    prepare_decoder_attention_mask,
)
from transformers import LlamaConfig


def save_random_head(config: dict, directory: str, seed: int) -> None:
    """A random head saved by SpecForge's own ``save_pretrained``: what its trainer writes."""
    torch.manual_seed(seed)
    head = LlamaForCausalLMEagle3(LlamaConfig(**config), attention_backend="sdpa")
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if name.endswith("norm.weight"):  # not all ones, so a swapped norm shows
                parameter.add_(0.1 * torch.randn_like(parameter))
        chosen = torch.randperm(config["vocab_size"])[: config["draft_vocab_size"]].sort().values
        head.d2t.copy_(chosen - torch.arange(config["draft_vocab_size"]))
        head.t2d.zero_()
        head.t2d[chosen] = True
    head.save_pretrained(directory)


def main() -> None:
    request, inputs = read_request()
    prompt, first, drafts = inputs["prompt_ids"], inputs["first_token"], inputs["draft_tokens"]
    if "make_head" in request:
        save_random_head(request["make_head"], request["head"], request.get("seed", 0))
        if not request.get("draft", True):
            write_answer({"saved": torch.ones(1)})
            return
    target, hidden_states = target_hidden_states(request["target"], prompt)
    raw_config = head_config(request["head"])
    head = LlamaForCausalLMEagle3(LlamaConfig(**raw_config), attention_backend="sdpa").eval()
    weights = head_weights(request["head"])
    missing, unexpected = head.load_state_dict(weights, strict=False)
    allowed_missing = {"embed_tokens.weight", "d2t", "t2d"}  # the last two: equal vocabularies
    missing = [k for k in missing if k not in allowed_missing]
    if missing or unexpected:
        sys.exit(f"SpecForge head: missing keys {missing}, unexpected keys {unexpected}")
    if "embed_tokens.weight" not in weights:
        embedding = target.get_input_embeddings().weight.detach().float().clone()
        head.embed_tokens.weight.data = embedding

    num_layers = target.config.num_hidden_layers
    layer_ids = raw_config.get("eagle_aux_hidden_state_layer_ids") or [
        2,
        num_layers // 2,
        num_layers - 3,
    ]
    features = torch.cat([hidden_states[i] for i in layer_ids], dim=-1)  # [1, n, 3H]
    length = prompt.numel()
    tokens = torch.cat([prompt[1:], first])[None]  # head position t reads token t+1
    positions = torch.arange(length)[None]
    logits, cache_hidden = [], [[], []]
    with torch.no_grad():
        hidden = head.project_hidden_states(features)
        mask = prepare_decoder_attention_mask(
            torch.ones(1, length, dtype=torch.bool), (1, length), hidden, 0
        )
        for step in range(drafts.numel() + 1):
            embedded = head.embed_input_ids(tokens)
            hidden = head.backbone(embedded, hidden, cache_hidden, mask, positions, use_cache=False)
            logits.append(head.compute_logits(hidden)[0, -1])
            if step < drafts.numel():
                tokens = torch.cat([tokens[:, 1:], drafts[step].view(1, 1)], dim=1)
    stacked = torch.stack(logits)
    write_answer({"logits": stacked, "argmax": stacked.argmax(-1)})


if __name__ == "__main__":
    main()
