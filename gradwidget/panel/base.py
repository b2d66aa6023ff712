"""What the mixins of GradientPanel (``sync.PanelSync``, ``background.PanelBackground``,
``selection.PanelSelection``, ``validation.PanelValidation``) read and call of the panel, declared for the type checker only: nothing here exists at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading

    from ..run import Run
    from .schedule import Throttle, Worker


class PanelBase:
    if TYPE_CHECKING:
        # traits
        meta: dict
        table: list
        hists: bytes
        hist_steps: bytes
        hist_all: bytes
        static_png: str
        step: int
        layer: int
        metric: str
        follow: bool
        choice_applied: int
        columns: int
        expanded: list
        # ipywidgets
        comm: Any
        model_id: str
        _trait_values: dict

        def hold_sync(self) -> Any: ...
        def send(self, content: Any, buffers: Any = None) -> None: ...
        def send_state(self, key: Any = None) -> None: ...

        # the panel's own state
        @property
        def recorder(self) -> Any: ...

        _reader: Any
        _static_run: Run | None
        _lock: threading.RLock
        _internal: int
        _seq: int
        _shape: dict | None
        _patched: bool
        _hist_all_sent: float
        _pushed_version: int
        _static_version: int
        _analysed_version: int
        _report: Any
        _report_version: int
        _view: tuple | None
        _static_table: tuple[int, str]
        _static_key: tuple | None
        _displays: list
        _outputs_version: int
        _outputs_due: bool
        _views_seen: bool
        diagnoses: list
        static_html: str
        _throttle: Throttle
        _worker: Worker
        _stop: threading.Event
        _thread: threading.Thread | None
        _initial_layer: Any
        _layer_chosen: bool
        push_count: int
        static_step: int | None
        _layer_rows: list
        _rows_cache: tuple
        _ready: bool

        @property
        def run(self) -> Run | None: ...
        def _on_step(self, run: Run) -> None: ...
        def _snap(self, step: int) -> int: ...
        def _set(self, values: dict) -> None: ...
        def _hold(self, values: dict) -> None: ...
        def _push(self, force: bool = False, check_version: bool = False, patch: bool = False) -> bool: ...
        def _rows_of(self, run: Run | None) -> Any: ...
        def _send_detail(self) -> None: ...
        def _regroup_table(self) -> None: ...
        def _update_outputs(self) -> None: ...
        def _final_static(self, wait: float) -> None: ...
        def _repr_mimebundle_(self, **kwargs: Any) -> Any: ...
        def _refresh_static(self) -> None: ...
