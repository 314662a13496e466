"""Top-level Flax modules: the encoder-decoder and the decoder-only transformer."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x.models._config import DecoderOnlyConfig, T5Config
from t5x.models._layers import combine_masks, make_attention_mask, make_decoder_mask
from t5x.models._network import Decoder, Encoder, token_embedder


class EncoderDecoderTransformer(nn.Module):
    """T5 encoder-decoder with a shared ``token_embedder``.

    Parameters: ``token_embedder/embedding``, ``encoder/...``, ``decoder/...``
    exactly as upstream t5x names them. ``step_kernels`` is how the decoder's decoding
    steps multiply (see ``Decoder``).
    """

    config: T5Config
    step_kernels: str = "xla"

    def setup(self) -> None:
        cfg = self.config
        self.token_embedder = token_embedder(cfg, name="token_embedder")
        self.encoder = Encoder(config=cfg, shared_embedding=self.token_embedder)
        self.decoder = Decoder(
            config=cfg,
            shared_embedding=self.token_embedder,
            cross_attention=True,
            step_kernels=self.step_kernels,
        )

    def encode(
        self,
        encoder_input_tokens: jax.Array,
        encoder_segment_ids: jax.Array | None = None,
        enable_dropout: bool = True,
    ) -> jax.Array:
        """Encodes ``[batch, in_len]`` ids (0 = padding) into ``[batch, in_len, embed]``."""
        dtype = self.config.dtype
        mask: jax.Array | None = make_attention_mask(
            encoder_input_tokens > 0, encoder_input_tokens > 0, dtype=dtype
        )
        if encoder_segment_ids is not None:
            mask = combine_masks(
                mask,
                make_attention_mask(encoder_segment_ids, encoder_segment_ids, jnp.equal, dtype=dtype),
                dtype=dtype,
            )
        return self.encoder(encoder_input_tokens, mask, not enable_dropout)

    def decode(
        self,
        encoded: jax.Array,
        encoder_input_tokens: jax.Array,
        decoder_input_tokens: jax.Array,
        decoder_target_tokens: jax.Array,
        encoder_segment_ids: jax.Array | None = None,
        decoder_segment_ids: jax.Array | None = None,
        decoder_positions: jax.Array | None = None,
        enable_dropout: bool = True,
        decode: bool = False,
        max_decode_length: int | None = None,
        *,
        hidden_only: bool = False,
    ) -> jax.Array:
        """Returns logits ``[batch, tgt_len, vocab]`` of the decoder over ``encoded``.

        With ``hidden_only``, the final hidden states the logits come from. Decoding step by
        step (``decode``), ``encoded`` and ``encoder_input_tokens`` may hold one row per
        example for several consecutive decoder rows (its beams or samples), which then share
        that example's cross-attention keys and values instead of a copy each.

        Raises:
          ValueError: when decoding with packed (segmented) inputs, or with decoder rows
            that are not a multiple of the encoder's.
        """
        del decoder_positions  # relative positions need no absolute positions
        dtype = self.config.dtype
        rows, examples = decoder_input_tokens.shape[0], encoded.shape[0]
        if rows != examples and not (decode and rows % examples == 0):
            raise ValueError(
                f"decoder inputs have {rows} rows and the encoder's output {examples}: they must be equal, "
                "or (decoding step by step) the decoder's a multiple of the encoder's"
            )
        if decode:
            decoder_mask = None
            # One mask per encoder row: its beams or samples (consecutive decoder rows) share it.
            every_position = jnp.ones((encoder_input_tokens.shape[0], decoder_target_tokens.shape[-1]))
            enc_dec_mask: jax.Array | None = make_attention_mask(
                every_position, encoder_input_tokens > 0, dtype=dtype
            )
        else:
            decoder_mask = make_decoder_mask(
                decoder_target_tokens, dtype, decoder_segment_ids=decoder_segment_ids
            )
            enc_dec_mask = make_attention_mask(
                decoder_target_tokens > 0, encoder_input_tokens > 0, dtype=dtype
            )
        if encoder_segment_ids is not None:
            if decode:
                raise ValueError(
                    "packed inputs cannot be decoded: encoder_segment_ids was given with decode=True"
                )
            if decoder_segment_ids is None:
                raise ValueError(
                    "encoder_segment_ids was given without decoder_segment_ids; packed batches need both"
                )
            enc_dec_mask = combine_masks(
                enc_dec_mask,
                make_attention_mask(decoder_segment_ids, encoder_segment_ids, jnp.equal, dtype=dtype),
                dtype=dtype,
            )
        return self.decoder(
            encoded,
            decoder_input_tokens,
            decoder_mask,
            enc_dec_mask,
            not enable_dropout,
            decode,
            max_decode_length,
            hidden_only=hidden_only,
        )

    def __call__(
        self,
        encoder_input_tokens: jax.Array,
        decoder_input_tokens: jax.Array,
        decoder_target_tokens: jax.Array,
        encoder_segment_ids: jax.Array | None = None,
        decoder_segment_ids: jax.Array | None = None,
        encoder_positions: jax.Array | None = None,
        decoder_positions: jax.Array | None = None,
        *,
        enable_dropout: bool = True,
        decode: bool = False,
        max_decode_length: int | None = None,
        hidden_only: bool = False,
    ) -> jax.Array:
        """Teacher-forced logits ``[batch, tgt_len, vocab]``.

        With ``hidden_only``, the decoder's final hidden states the logits come from.
        """
        del encoder_positions
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout)
        return self.decode(
            encoded,
            encoder_input_tokens,
            decoder_input_tokens,
            decoder_target_tokens,
            encoder_segment_ids,
            decoder_segment_ids,
            decoder_positions,
            enable_dropout,
            decode,
            max_decode_length,
            hidden_only=hidden_only,
        )


class DecoderOnlyTransformer(nn.Module):
    """Causal or prefix-LM decoder; every parameter lives under ``decoder/``.

    ``step_kernels`` is how decoding steps multiply (see ``Decoder``).
    """

    config: DecoderOnlyConfig
    step_kernels: str = "xla"

    def setup(self) -> None:
        self.decoder = Decoder(
            config=self.config,
            shared_embedding=None,
            cross_attention=False,
            step_kernels=self.step_kernels,
            name="decoder",
        )

    def __call__(
        self,
        decoder_input_tokens: jax.Array,
        decoder_target_tokens: jax.Array,
        decoder_segment_ids: jax.Array | None = None,
        decoder_positions: jax.Array | None = None,
        decoder_causal_attention: jax.Array | None = None,
        *,
        enable_dropout: bool = True,
        decode: bool = False,
        max_decode_length: int | None = None,
        prefill: bool = False,
        prefill_lengths: jax.Array | None = None,
        hidden_only: bool = False,
    ) -> jax.Array:
        """Logits ``[batch, length, vocab]``.

        Args:
          decoder_input_tokens: ``[batch, length]`` (targets shifted right).
          decoder_target_tokens: ``[batch, length]``; 0 is padding.
          decoder_segment_ids: packing ids or None.
          decoder_positions: unused (relative positions).
          decoder_causal_attention: ``[batch, length]``, 1 on the bidirectional
            prefix (prefix LM), or None for a causal LM.
          enable_dropout: training mode.
          decode: single-step decoding against the cache.
          max_decode_length: cache length, needed with ``decode``.
          prefill: fill the cache with a whole prompt.
          prefill_lengths: ``[batch]`` prompt lengths for ``prefill``.
          hidden_only: return the final hidden states the logits come from.
        """
        del decoder_positions
        mask = None
        if not decode:
            mask = make_decoder_mask(
                decoder_target_tokens,
                self.config.dtype,
                decoder_causal_attention=decoder_causal_attention,
                decoder_segment_ids=decoder_segment_ids,
            )
        return self.decoder(
            None,
            decoder_input_tokens,
            mask,
            None,
            not enable_dropout,
            decode,
            max_decode_length,
            prefill,
            prefill_lengths,
            hidden_only=hidden_only,
        )
