"""Reading an exported notebook's HTML the way a person sees it: the panel's static images and the
health table's layers (what nbconvert keeps when the widget state is not saved)."""

import re


def panel_images(html: str) -> list[str]:
    """The base64 PNGs of the panel's static images, in page order."""
    tags = [t for t in re.findall(r"<img\b[^>]*>", html) if 'class="gradwidget-panel-image"' in t]
    return [m.group(1) for t in tags if (m := re.search(r'src="data:image/png;base64,([^"]+)"', t))]


def table_layers(html: str) -> list[str]:
    """The layer names of the health table's rows, in page order."""
    return re.findall(r'<tr data-layer="([^"]+)"', html)
