"""Triton's interpreter made to work with numpy >= 2.4, for the tests that run the fused
statistics kernel on CPU (conftest.py, and the distributed tests' workers, dist_worker.py)."""


def mend() -> None:
    """Triton 3.6's interpreter turns its scalars (1-element arrays) into loop bounds with int(),
    which numpy >= 2.4 refuses for arrays of one dimension: take the element instead. Nothing
    where Triton is not installed."""
    try:
        from triton.runtime import interpreter
    except Exception:
        return
    patch = interpreter._patch_lang_tensor
    if getattr(patch, "mended", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.mended = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched
