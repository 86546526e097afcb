"""Reduced EAGLE-3 draft vocabulary: frequency ranking, special tokens, d2t/t2d and mapping."""

from __future__ import annotations

import pytest
import torch

from backend.errors import ConfigError
from models.training.draft_vocab import (
    build_draft_vocab,
    install_draft_vocab,
    token_counts,
)
from tests.factories import tiny_head, tiny_target

#                       id: 0  1  2  3  4  5  6  7  8  9
COUNTS = torch.tensor([0, 5, 1, 7, 0, 3, 3, 0, 9, 2])


def test_most_frequent_ids_plus_specials_sorted_by_target_id():
    vocab = build_draft_vocab(COUNTS, draft_vocab_size=5, always_include=[0])
    # eos (0) is forced in; then 8 (9), 3 (7), 1 (5); 5 and 6 tie at 3: the lower id wins
    assert vocab.target_ids.tolist() == [0, 1, 3, 5, 8]
    assert vocab.d2t.tolist() == [0, 0, 1, 2, 4]  # target id = draft id + d2t[draft id]
    assert (torch.arange(5) + vocab.d2t).tolist() == vocab.target_ids.tolist()
    assert vocab.t2d.tolist() == [True, True, False, True, False, True, False, False, True, False]
    ids = torch.tensor([[8, 6, 0], [3, 5, 9]])
    assert vocab.to_draft_ids(ids).tolist() == [[4, -1, 0], [2, 3, -1]]


def test_unseen_tokens_fill_remaining_slots_and_full_size_is_identity():
    vocab = build_draft_vocab(torch.tensor([0, 0, 4, 0]), draft_vocab_size=3)
    assert vocab.target_ids.tolist() == [0, 1, 2]  # 2 by count, then 0 and 1 by id
    full = build_draft_vocab(COUNTS, draft_vocab_size=10)
    assert full.d2t.tolist() == [0] * 10 and bool(full.t2d.all())


def test_counts_only_masked_tokens():
    sequences = [([1, 2, 2, 3], [0, 1, 1, 0]), ([3, 3], [1, 1])]
    assert token_counts(sequences, vocab_size=5).tolist() == [0, 0, 2, 2, 0]


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError):
        build_draft_vocab(COUNTS, draft_vocab_size=0)
    with pytest.raises(ConfigError):
        build_draft_vocab(COUNTS, draft_vocab_size=11)
    with pytest.raises(ConfigError, match="special"):
        build_draft_vocab(COUNTS, draft_vocab_size=2, always_include=[0, 4, 7])


def test_install_into_an_eagle3_head():
    target = tiny_target(vocab_size=10, num_layers=8)
    head = tiny_head("eagle3", target, draft_vocab_size=5)
    vocab = build_draft_vocab(COUNTS, draft_vocab_size=5, always_include=[0])
    install_draft_vocab(head, vocab)
    assert head.to_target_ids(torch.arange(5)).tolist() == [0, 1, 3, 5, 8]
    assert head.t2d.tolist() == vocab.t2d.tolist()
    with pytest.raises(ConfigError):
        install_draft_vocab(head, build_draft_vocab(COUNTS, draft_vocab_size=4))
    with pytest.raises(ConfigError):
        install_draft_vocab(tiny_head("eagle1", target), vocab)
