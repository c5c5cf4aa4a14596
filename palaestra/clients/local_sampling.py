"""Per-row sampling and streamed-text hold-back for LocalClient's generation loop.

``sample`` draws one token per row with the Gumbel-max trick, the noise coming from each row's
own ``torch.Generator`` (float64 uniforms: Gumbel tails reach ~36), so a seeded request samples
the same noise whatever shares its batch.
``releasable`` says how much of a reply's text a stream may show yet: never a trailing partial
UTF-8 character nor a tail that could be the start of a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REPLACEMENT = "\ufffd"  # what a decoder shows for the bytes of an unfinished UTF-8 character


def sample(
    logits: torch.Tensor, params: torch.Tensor, generators: Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row, and its logprob, from float32 ``logits`` [rows, vocab].

    ``params`` rows are (temperature, top_p, top_k); temperature 0 is greedy, top_k 0 is off.
    Temperature, then top-k, then top-p, as transformers' ``generate`` applies them. A sampled
    row's token is the Gumbel-max of its filtered logprobs with noise from its own generator, so
    it does not depend on the other rows. The logprob is that of the distribution sampled from
    (greedy rows: the model's log-softmax at temperature 1).
    """
    import torch

    temperature, top_p, top_k = params.unbind(-1)
    greedy = temperature == 0
    scores = logits / torch.where(greedy, 1.0, temperature)[:, None]
    filtered = ~greedy & (top_k > 0)
    if filtered.any():
        k = top_k.clamp(1, scores.shape[-1]).long()
        kth = torch.topk(scores, int(k.max())).values.gather(1, (k - 1)[:, None])
        scores = scores.masked_fill(filtered[:, None] & (scores < kth), float("-inf"))
    filtered = ~greedy & (top_p < 1)
    if filtered.any():
        ordered, order = scores.sort(dim=-1, descending=True)
        probs = ordered.softmax(-1)
        drop = ((probs.cumsum(-1) - probs) >= top_p[:, None]) & filtered[:, None]
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    logprobs = scores.log_softmax(-1)
    noise = torch.zeros_like(logprobs)
    sampled = (~greedy).nonzero().flatten().tolist()
    if sampled:  # Gumbel(0, 1) = -log(-log(U)); uniform draws are ~10x cheaper than exponential ones
        uniform = torch.empty((len(sampled), logprobs.shape[-1]), dtype=torch.float64, device=logprobs.device)
        for row, i in enumerate(sampled):
            uniform[row].uniform_(generator=generators[i])
        noise[sampled] = (-(-uniform.log()).log()).to(noise.dtype)
    tokens = (logprobs + noise).argmax(-1)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def releasable(text: str, stop: Sequence[str]) -> int:
    """How many leading characters of a reply's ``text`` so far a stream may show now.

    Held back: trailing replacement characters (a multi-byte character whose last token has not
    come yet) and the longest tail that is the beginning of a stop string (the reply may still be
    cut there). A stop string found whole ends the reply before this is asked.
    """
    end = len(text)
    while end and text[end - 1] == REPLACEMENT:
        end -= 1
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, end), hold, -1):
            if text.startswith(s[:k], end - k):
                hold = k
                break
    return end - hold
