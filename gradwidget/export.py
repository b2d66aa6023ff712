"""Exported notebooks that show the panel with no widget running.

A ``GradientPanel`` output carries, beside the widget view, a static rendition of its current view:
``image/png`` (the panel figure) and ``text/html`` (that image plus the health table, inside
``div.gradwidget-static``). What nbconvert does with it depends on the notebook:

* no saved widget state: ``--to html`` drops the widget view and shows one of the other mime types,
  so the static rendition appears;
* saved widget state (what ``jupyter nbconvert --execute`` stores by default, and JupyterLab when
  "Save Widget State Automatically" is on): ``--to html`` emits only the widget view, which
  html-manager draws after loading from a CDN, so an offline reader sees nothing.

``jupyter nbconvert --to gradwidget notebook.ipynb`` (this module's ``GradwidgetHTMLExporter``,
registered as an nbconvert exporter entry point) handles both: every widget output that carries a
static rendition shows it, always in the page, and where the live widget loads it replaces the
static copy. When the saved widget state holds the panel's newest rendition (``static_png`` and
``static_html``, kept current after every cell), that one is shown: a panel displayed before the
training cell exports its final state. With ``--to html``, add ``--HTMLExporter.preprocessors=gradwidget.export.StaticOnly``
to get the static rendition alone (the widget views are dropped).
"""

from __future__ import annotations

import base64
from pathlib import Path

from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, default

from .report import FALLBACK_CLASS, static_fallback_html

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PNG_URL = "data:image/png;base64,"
TEMPLATES = Path(__file__).parent / "templates" / "nbconvert"


def _png_bytes(data) -> bytes | None:
    if not data:
        return None
    if isinstance(data, list):
        data = "".join(data)
    try:
        return base64.b64decode(data)
    except (ValueError, TypeError):
        return None


def static_html_of(data: dict) -> str | None:
    """The static rendition of one widget output's mime bundle, as HTML, or None if it has none.

    A bundle made by gradwidget already holds it in ``text/html``; for any other widget output that
    carries an ``image/png``, the image (and its ``text/html``, if any) is wrapped the same way.
    """
    html = data.get("text/html", "")
    if isinstance(html, list):
        html = "".join(html)
    if FALLBACK_CLASS in html:
        return html
    png = _png_bytes(data.get("image/png"))
    if png is None:
        return None
    return static_fallback_html(png, html)


def widget_states(nb) -> dict:
    """``{model_id: state}`` of the notebook's saved widget state (empty when none was saved)."""
    saved = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {})
    states = saved.get("state", {}) if isinstance(saved, dict) else {}
    return {k: v.get("state", {}) for k, v in states.items() if isinstance(v, dict)}


def state_static(data: dict, states: dict) -> tuple[str, str] | None:
    """``(png_base64, html)``: the newest static rendition of a widget output's model, from the
    saved widget state (``static_html``: the whole static panel, or a comparison's table), or None
    when the state holds none.

    Why: an output's own mime bundle is frozen when its cell ran (``panel`` shown before training
    shows no step), while the panel keeps ``static_png``/``static_html`` current in its state.
    """
    view = data.get(WIDGET_VIEW)
    model_id = view.get("model_id") if isinstance(view, dict) else None
    state = states.get(model_id, {})
    url = state.get("static_png", "")
    if not isinstance(url, str) or not url.startswith(PNG_URL):
        return None
    table = state.get("static_html", "")
    return url[len(PNG_URL) :], table if isinstance(table, str) else ""


class StaticFallbackPreprocessor(Preprocessor):
    """Make every widget output's static rendition available to the HTML templates.

    For each output with a widget view and a static rendition, ``text/html`` becomes that rendition
    (image plus health table, marked ``gradwidget-static``). The saved widget state's rendition (the
    panel's latest) wins over the one in the output (the panel when its cell ran). With
    ``keep_live=False`` the widget view is removed, so any exporter shows the static rendition alone.
    """

    keep_live = Bool(True, help="keep the widget view next to the static rendition").tag(config=True)

    def preprocess(self, nb, resources):
        self._states = widget_states(nb)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        states = getattr(self, "_states", {})
        for out in cell.get("outputs", []):
            if out.get("output_type") not in ("display_data", "execute_result"):
                continue
            data = out.get("data", {})
            if WIDGET_VIEW not in data:
                continue
            latest = state_static(data, states)
            if latest is not None:
                png, saved = latest
                data["image/png"] = png
                # the panel's static_html is the whole static panel; a comparison's, its table
                html = saved if FALLBACK_CLASS in saved else static_fallback_html(_png_bytes(png), saved)
            else:
                html = static_html_of(data)
            if html is None:
                continue
            data["text/html"] = html
            if not self.keep_live:
                del data[WIDGET_VIEW]
        return cell, resources


class StaticOnly(StaticFallbackPreprocessor):
    """``StaticFallbackPreprocessor(keep_live=False)``, for ``--HTMLExporter.preprocessors=...``."""

    @default("keep_live")
    def _keep_live_default(self):
        return False

    @default("enabled")
    def _enabled_default(self):
        return True


class GradwidgetHTMLExporter(HTMLExporter):
    """``jupyter nbconvert --to gradwidget``: JupyterLab-style HTML in which widget outputs carrying a
    static rendition show it with the network off, and are replaced by the live widget where the
    widget manager loads. Works whether or not the notebook has saved widget state (and with
    ``--execute``, which saves it)."""

    export_from_notebook = "HTML (gradwidget static panels)"

    @default("template_name")
    def _template_name_default(self):
        return "gradwidget"

    @default("extra_template_basedirs")
    def _default_extra_template_basedirs(self):
        return [str(TEMPLATES), *super()._default_extra_template_basedirs()]


def export_html(notebook, path=None, force: bool = False, **kw) -> str:
    """Export a notebook (path or NotebookNode) with ``GradwidgetHTMLExporter``; write it to ``path``
    if given (an existing file is replaced only with ``force``) and return the HTML."""
    import nbformat

    if path is not None:
        from .storage import check_output_file

        check_output_file(path, force)  # before the work

    nb = nbformat.read(str(notebook), as_version=4) if isinstance(notebook, (str, Path)) else notebook
    body, _ = GradwidgetHTMLExporter(**kw).from_notebook_node(nb)
    if path is not None:
        from .storage import atomic_output

        with atomic_output(path, force, encoding="utf-8") as f:
            f.write(body)
    return body
