"""Per-round commit quota (SDAR `get_num_transfer_tokens`, LLaDA's linear schedule)."""


def round_quotas(block_length: int, steps: int) -> list[int]:
    """Split `block_length` tokens over `steps` rounds: `block_length // steps` each, the first
    `block_length % steps` rounds one more. Rounds past `block_length` get 0."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if r < extra else 0) for r in range(steps)]
