"""The tiny default policy: exact tokenizer round trip, determinism, sizes, env corpus."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_texts import TEXTS

import mcgpo
from mcgpo.policy import build_tiny_policy, tiny_model, train_tokenizer
from mcgpo.rollout import encode_prompt, environment_corpus, format_response, render_prompt


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80))
def test_tokenizer_round_trips_any_text(small_policy, text):
    _, tok = small_policy
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE, no space clean-up


def test_special_tokens_and_bos(small_policy):
    _, tok = small_policy
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<|pad|>", "<|bos|>", "<|eos|>")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok("go to fridge 1")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.bos_token_id not in ids[1:]
    assert tok.decode(ids, skip_special_tokens=True) == "go to fridge 1"
    assert tok.chat_template is None  # plain prompts for the tiny model


def test_frequent_words_become_single_tokens(small_policy):
    _, tok = small_policy
    # "fridge" appears 80 times in the corpus: BPE merges it (and " fridge") into one token
    assert len(tok(" fridge", add_special_tokens=False)["input_ids"]) == 1


def test_same_inputs_same_policy_other_seed_other_weights():
    a_model, a_tok = build_tiny_policy(texts=TEXTS, seed=3, vocab_size=400, hidden_size=32)
    b_model, b_tok = build_tiny_policy(texts=TEXTS, seed=3, vocab_size=400, hidden_size=32)
    c_model, c_tok = build_tiny_policy(texts=TEXTS, seed=4, vocab_size=400, hidden_size=32)
    assert a_tok.backend_tokenizer.to_str() == b_tok.backend_tokenizer.to_str()
    assert a_tok.get_vocab() == c_tok.get_vocab()  # the vocabulary does not depend on the seed
    a, b, c = a_model.state_dict(), b_model.state_dict(), c_model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_building_does_not_touch_the_global_rng(small_policy):
    _, tok = small_policy
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model(tok, seed=0, hidden_size=32)
    assert torch.equal(torch.rand(3), expected)


def test_default_architecture_and_parameter_count(small_policy):
    _, tok = small_policy
    model = tiny_model(tok)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.tie_word_embeddings
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (128, 2, 512)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    # Per layer, d = 128, head_dim = 32, 2 KV heads (KV width 64), MLP 512:
    #   q 128*128 + 128 = 16512, k and v 128*64 + 64 = 8256 each, o 128*128 = 16384,
    #   gate/up/down 3 * 128*512 = 196608, two RMSNorms 256  ->  246272
    # 2 layers + final norm 128 + tied embedding 128 * V
    assert sum(p.numel() for p in model.parameters()) == 2 * 246272 + 128 + 128 * len(tok)


def test_bad_sizes_are_rejected(small_policy):
    _, tok = small_policy
    with pytest.raises(ValueError, match="hidden_size 30 is not divisible by num_heads 4"):
        tiny_model(tok, hidden_size=30)
    with pytest.raises(ValueError, match="num_heads 4 is not divisible by num_kv_heads 3"):
        tiny_model(tok, num_kv_heads=3)
    with pytest.raises(ValueError, match="vocab_size must be >= 260"):
        train_tokenizer(TEXTS, vocab_size=100)


def test_household_policy_knows_the_environment_text():
    model, tok = build_tiny_policy(environment_corpus(("household",), episodes=16), seed=0)
    env = mcgpo.make_env("household")
    obs = env.reset(seed=101, split="train")
    for _ in range(5):  # expert actions of an unseen task round-trip and stay short
        action = env.expert_action()
        ids = tok(format_response(action, "action"), add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == action
        assert len(ids) <= len(action.split()) + 2
        obs = env.step(action).observation
    prompt = encode_prompt(tok, render_prompt(obs, []))
    assert len(prompt) < len(render_prompt(obs, [])) / 3  # words, not bytes
    assert model.config.vocab_size == len(tok)


def test_household_names_are_single_tokens_and_actions_copy_token_for_token():
    from mcgpo.envs.household.catalog import OBJECTS

    # the training default corpus: 256 episodes (corpus_episodes)
    _, tok = build_tiny_policy(environment_corpus(("household",), episodes=256), seed=0)
    names = set(OBJECTS) | {rec for places, _ in OBJECTS.values() for rec in places}
    for name in sorted(names):  # every object and receptacle type is one token after a space
        assert len(tok(" " + name, add_special_tokens=False)["input_ids"]) == 1, name
    env = mcgpo.make_env("household")
    obs = env.reset(seed=5, split="valid_unseen")
    for _ in range(4):
        action = env.expert_action()
        prompt = encode_prompt(tok, render_prompt(obs, [], response_format="action"))
        response = tok(format_response(action, "action"), add_special_tokens=False)["input_ids"]
        # the compact prompt puts each admissible action on its own line, so the response is
        # the same token sequence as the line it copies: search it between two newlines
        newline = tok("\n", add_special_tokens=False)["input_ids"]
        line = [*newline, *response, *newline]
        assert any(prompt[i : i + len(line)] == line for i in range(len(prompt))), action
        obs = env.step(action).observation


def test_the_tiny_builder_needs_no_rollout_or_training_layer():
    # policy sits below rollout: building a tiny policy from texts imports neither layer
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from mcgpo.policy import build_tiny_policy\n"
        "build_tiny_policy(['go to fridge 1', 'open drawer 2'] * 4, vocab_size=300,"
        " hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('mcgpo.rollout', 'mcgpo.training'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
