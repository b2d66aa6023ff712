"""The zoo's mistakes as they happen in real code on the new architectures (filled in next)."""
