// The panel's CSS: JupyterLab's theme variables with fallbacks, so it follows light and dark themes
// in JupyterLab 4 and Notebook 7 and stays readable elsewhere.

import { MIN_WIDTH } from "./layout";

export const CSS = `
.gw-root{--gw-bg:var(--jp-layout-color0,#fff);--gw-bg2:var(--jp-layout-color1,#fff);--gw-bg3:var(--jp-layout-color2,#eee);
 --gw-fg:var(--jp-ui-font-color1,rgba(0,0,0,.87));--gw-fg2:var(--jp-ui-font-color2,rgba(0,0,0,.54));
 --gw-border:var(--jp-border-color2,#e0e0e0);--gw-accent:var(--jp-brand-color1,#1976d2);
 font-family:var(--jp-ui-font-family,system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif);
 font-size:var(--jp-ui-font-size1,13px);color:var(--gw-fg);background:var(--gw-bg);
 box-sizing:border-box;width:100%;min-width:${MIN_WIDTH + 8}px;padding:6px 4px;outline:none;position:relative}
.gw-root:focus-visible{box-shadow:0 0 0 2px var(--gw-accent)}
.gw-root *{box-sizing:border-box}
.gw-header{display:flex;flex-wrap:wrap;align-items:center;gap:6px 10px;margin:0 0 6px}
.gw-title{font-weight:600}
.gw-info{color:var(--gw-fg2);font-variant-numeric:tabular-nums}
.gw-spacer{flex:1}
.gw-root select,.gw-root button,.gw-root input[type=search]{font:inherit;color:var(--gw-fg);background:var(--gw-bg2);
 border:1px solid var(--gw-border);border-radius:3px;padding:2px 6px}
.gw-root button{cursor:pointer;min-width:2.4em}
.gw-root button:hover{border-color:var(--gw-accent)}
.gw-live{font-size:11px;padding:1px 7px;border-radius:9px;background:var(--gw-bg3);color:var(--gw-fg2)}
.gw-live.gw-on{background:#2e7d32;color:#fff}
.gw-message{display:none;margin:0 0 6px;padding:6px 10px;border-left:4px solid #ef8f00;background:var(--gw-bg3)}
.gw-message.gw-show{display:block}
.gw-message.gw-error{border-left-color:#c62828}
.gw-message.gw-info{border-left-color:var(--gw-accent)}
.gw-verdict{margin:0 0 4px;padding:3px 8px;font-weight:600;border-left:4px solid #c62828}
.gw-verdict.gw-healthy{border-left-color:#2e7d32;font-weight:normal}
.gw-diagnoses{display:none;margin:0 0 6px;border:1px solid var(--gw-border);border-radius:3px}
.gw-diagnoses.gw-show{display:block}
.gw-diagnosis{padding:3px 8px;cursor:pointer;border-left:4px solid #ef8f00;white-space:normal;overflow-wrap:anywhere}
.gw-dhead{font-weight:600}
.gw-daction{color:var(--gw-fg)}
.gw-diagnosis details{font-size:11px;color:var(--gw-fg2);cursor:auto}
.gw-diagnosis summary{cursor:pointer;width:max-content}
.gw-devidence{white-space:pre-wrap;padding:2px 0 2px 12px}
.gw-diagnosis+.gw-diagnosis{border-top:1px solid var(--gw-border)}
.gw-diagnosis:hover{background:var(--gw-bg3)}
.gw-diagnosis.gw-p-critical{border-left-color:#c62828}
.gw-diagnosis.gw-p-low{border-left-color:var(--gw-border)}
.gw-main{position:relative}
.gw-main canvas{display:block;touch-action:none;cursor:crosshair}
.gw-slider-row{display:flex;align-items:center;gap:8px}
.gw-slider{flex:none;margin:2px 0;accent-color:var(--gw-accent)}
.gw-legend{display:flex;flex-wrap:wrap;align-items:center;gap:4px 12px;font-size:11px;color:var(--gw-fg2);margin:4px 0 8px}
.gw-cbar{display:inline-block;width:120px;height:10px;border:1px solid var(--gw-border);vertical-align:middle}
.gw-chip{display:inline-block;width:10px;height:10px;border:1px solid var(--gw-border);vertical-align:middle;margin-right:3px}
.gw-tip{position:absolute;pointer-events:none;z-index:5;display:none;white-space:pre;font-size:11px;line-height:1.35;
 padding:4px 7px;border-radius:3px;background:var(--gw-bg2);color:var(--gw-fg);border:1px solid var(--gw-border);
 box-shadow:0 1px 4px rgba(0,0,0,.25)}
.gw-bottom{display:flex;gap:12px;align-items:flex-start}
.gw-bottom.gw-stacked{flex-direction:column}
.gw-bottom.gw-stacked .gw-plots{flex-direction:row;flex-wrap:wrap;gap:8px}
.gw-table{flex:1;min-width:0;width:100%}
.gw-table-bar{display:flex;flex-wrap:wrap;gap:4px 8px;align-items:center;margin-bottom:4px}
.gw-filter{flex:1;min-width:80px}
.gw-count{color:var(--gw-fg2);font-size:11px;white-space:nowrap}
.gw-table-scroll{max-height:300px;overflow:auto;border:1px solid var(--gw-border)}
table.gw-health{border-collapse:collapse;width:100%;font-size:12px}
table.gw-health th{position:sticky;top:0;background:var(--gw-bg2);text-align:left;cursor:pointer;user-select:none;
 padding:3px 6px;border-bottom:1px solid var(--gw-border);white-space:nowrap;font-weight:600}
table.gw-health td{padding:2px 6px;border-bottom:1px solid var(--gw-border);white-space:nowrap}
table.gw-health tr{cursor:pointer}
table.gw-health tbody tr:hover{background:var(--gw-bg3)}
table.gw-health tr.gw-selected{background:color-mix(in srgb,var(--gw-accent) 22%,transparent)}
table.gw-health .gw-num{text-align:right;font-variant-numeric:tabular-nums}
table.gw-health .gw-name{font-family:var(--jp-code-font-family,monospace)}
.gw-toggle{border:none;background:none;color:inherit;cursor:pointer;padding:0 4px 0 0;font:inherit}
.gw-toggle:focus-visible{outline:2px solid var(--gw-accent,#1f77b4)}
table.gw-health .gw-suggestion{min-width:220px;white-space:normal;overflow-wrap:anywhere}
table.gw-health td.gw-name{white-space:nowrap;overflow:hidden;text-overflow:ellipsis;max-width:24em}
table.gw-health tr.gw-group-start td{border-top:2px solid var(--jp-border-color1,#bbb)}
table.gw-health td{vertical-align:top}
.gw-more{font-size:11px !important;white-space:nowrap}
.gw-badge{display:inline-block;padding:0 7px;border-radius:8px;color:#fff;font-weight:600;font-size:11px}
.gw-plots{display:flex;flex-direction:column;gap:4px;flex:none}
.gw-noise-text{font-size:11px;max-width:520px;opacity:.85}
.gw-noise-text summary{cursor:pointer}
.gw-fallback{display:none;max-width:100%}
.gw-fallback.gw-show{display:block}
`;

/** Put the panel's stylesheet where the element lives: the document's head, or the shadow root a
 *  front end renders widgets into (marimo), which a stylesheet in the head never reaches. Once per
 *  root. */
export function installStyle(el: Node): void {
  const root = el.getRootNode();
  const isShadow = typeof ShadowRoot !== "undefined" && root instanceof ShadowRoot;
  const doc = el.ownerDocument ?? document;
  const where: ParentNode = isShadow ? (root as ShadowRoot) : doc.head;
  if (where.querySelector("#gradwidget-style")) return;
  const s = doc.createElement("style");
  s.id = "gradwidget-style";
  s.textContent = CSS;
  where.append(s);
}
