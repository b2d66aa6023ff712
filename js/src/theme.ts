// Colours of text, grid and background from JupyterLab's CSS variables (light or dark theme),
// with fallbacks for hosts that do not define them (VS Code, plain HTML, exported pages).

export interface Theme {
  bg: string;
  fg: string;
  fg2: string; // secondary text
  grid: string;
  border: string;
  accent: string; // selection, cursor
  cursor: string;
  dark: boolean;
  font: string;
}

const FALLBACK_LIGHT = { bg: "#ffffff", fg: "rgba(0,0,0,0.87)", fg2: "rgba(0,0,0,0.54)", border: "#e0e0e0" };
const FALLBACK_DARK = { bg: "#111111", fg: "rgba(255,255,255,1)", fg2: "rgba(255,255,255,0.54)", border: "#424242" };

/** Parse "#rgb", "#rrggbb", "rgb(...)" or "rgba(...)" into [r, g, b] (0..255), or null. */
export function parseColor(s: string): [number, number, number] | null {
  const t = s.trim();
  let m = /^#([0-9a-f]{3})$/i.exec(t);
  if (m) return [0, 1, 2].map((i) => parseInt(m![1][i] + m![1][i], 16)) as [number, number, number];
  m = /^#([0-9a-f]{6})([0-9a-f]{2})?$/i.exec(t);
  if (m) return [0, 2, 4].map((i) => parseInt(m![1].slice(i, i + 2), 16)) as [number, number, number];
  m = /^rgba?\(\s*([\d.]+)[\s,]+([\d.]+)[\s,]+([\d.]+)/i.exec(t);
  if (m) return [Number(m[1]), Number(m[2]), Number(m[3])];
  return null;
}

/** Is a background colour dark (perceived lightness below the middle)? */
export function isDark(bg: string): boolean {
  const c = parseColor(bg);
  if (!c) return false;
  return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 128;
}

/** A plot's frame and its title above it (histogram, series). Leaves the context saved once:
 *  the caller restores it. */
export function beginPlot(ctx: CanvasRenderingContext2D, r: { x: number; y: number; w: number; h: number }, title: string, t: Theme): void {
  ctx.save();
  ctx.font = `11px ${t.font}`;
  ctx.fillStyle = t.fg;
  ctx.textAlign = "left";
  ctx.textBaseline = "bottom";
  ctx.fillText(title, r.x, r.y - 4);
  ctx.strokeStyle = t.grid;
  ctx.strokeRect(r.x + 0.5, r.y + 0.5, r.w - 1, r.h - 1);
}

/** The theme in force for an element. JupyterLab sets `data-jp-theme-light` on <body>. */
export function readTheme(el: Element): Theme {
  const cs = getComputedStyle(el);
  const v = (name: string) => cs.getPropertyValue(name).trim();
  const bodyLight = document.body?.dataset?.jpThemeLight;
  let bg = v("--jp-layout-color0");
  const dark = bg ? isDark(bg) : bodyLight === "false" || matchMedia?.("(prefers-color-scheme: dark)").matches === true;
  const fb = dark ? FALLBACK_DARK : FALLBACK_LIGHT;
  bg = bg || fb.bg;
  return {
    bg,
    fg: v("--jp-ui-font-color1") || fb.fg,
    fg2: v("--jp-ui-font-color2") || fb.fg2,
    grid: v("--jp-border-color2") || fb.border,
    border: v("--jp-border-color1") || fb.border,
    accent: v("--jp-brand-color1") || (dark ? "#64b5f6" : "#1976d2"),
    cursor: dark ? "#ffffff" : "#000000",
    dark,
    font: v("--jp-ui-font-family") || "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif",
  };
}
