"""Triton's interpreter made to work with numpy >= 2.4, for the tests that run the fused
statistics kernel on CPU (conftest.py, and the distributed tests' workers, dist_worker.py)."""


def mend() -> None:
    """Triton's interpreter (3.6 to 3.9 at least) turns its scalars (1-element arrays) into loop bounds with int(),
    which numpy >= 2.4 refuses for arrays of one dimension: take the element instead. Nothing
    where Triton is not installed."""
    try:
        from triton.runtime import interpreter
    except Exception:
        return
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "mended", False):  # another Triton's insides, or mended already
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.mended = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched
