"""Zoo models written with Hugging Face Transformers' Flax classes (4.57, the last release line
with them; 5.0 removed them): ``FlaxBertModel`` built from a ``BertConfig`` with random
weights (``_do_init=True``; nothing is downloaded). The builder returns ``(fn, args)`` with the
parameters among the arguments, as a user calls ``model(ids, attention_mask=..., params=...)``.
"""

from __future__ import annotations

import numpy as np

import jax.numpy as jnp

from bench.zoo.inputs import padding_mask, token_ids


def hf_bert(cfg, seed):
    from transformers import BertConfig, FlaxBertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()   # the Flax classes' deprecation notice, once per build
    config = BertConfig(vocab_size=cfg["vocab"], hidden_size=cfg["d"],
                        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                        intermediate_size=cfg["ff"], max_position_embeddings=max(cfg["seq"], 8))
    model = FlaxBertModel(config, seed=seed, _do_init=True)
    rng = np.random.default_rng(seed)
    b, s = cfg["batch"], cfg["seq"]
    ids = token_ids(rng, (b, s), cfg["vocab"])
    mask = padding_mask(b, s).astype(jnp.int32)   # Transformers takes an int mask

    def fn(params, ids, mask):
        return model(ids, attention_mask=mask, params=params, train=False).last_hidden_state
    return fn, (model.params, ids, mask)


def hf_llama_decode(cfg, seed):
    """One decode step of ``FlaxLlamaForCausalLM`` (GQA) with its KV cache, as a generation
    loop calls it: the prompt is run once at build time (jax.jit) to fill the cache, and the
    step takes the parameters, the last token, the cache and the position, and returns the
    next token's logits and the updated cache."""
    import jax
    from transformers import FlaxLlamaForCausalLM, LlamaConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    config = LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["d"],
                         intermediate_size=cfg["ff"], num_hidden_layers=cfg["layers"],
                         num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
                         max_position_embeddings=cfg["cache"])
    model = FlaxLlamaForCausalLM(config, seed=seed, _do_init=True)
    rng = np.random.default_rng(seed)
    b, p = cfg["batch"], cfg["prompt"]
    mask = jnp.ones((b, cfg["cache"]), jnp.int32)

    def prefill(params, ids, cache):
        out = model(ids, attention_mask=mask, position_ids=jnp.broadcast_to(jnp.arange(p), (b, p)),
                    past_key_values=cache, params=params)
        return jnp.argmax(out.logits[:, -1], -1), out.past_key_values
    tok, cache = jax.jit(prefill)(model.params, token_ids(rng, (b, p), cfg["vocab"]),
                                  model.init_cache(b, cfg["cache"]))

    def fn(params, tok, cache, t):
        out = model(tok[:, None], attention_mask=mask, position_ids=jnp.full((b, 1), t),
                    past_key_values=cache, params=params)
        return out.logits[:, -1], out.past_key_values
    return fn, (model.params, tok, cache, jnp.int32(p))
