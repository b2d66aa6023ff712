// Axis ticks on round numbers (1, 2 or 5 times a power of ten) between lo and hi, at most
// `maxTicks` of them; the kernel's copy is gradwidget/panel/rendition.py `nice_ticks`.

export function niceTicks(lo: number, hi: number, maxTicks: number): number[] {
  if (!(hi >= lo) || !isFinite(lo) || !isFinite(hi)) return [];
  if (hi === lo) return [lo];
  const n = Math.max(2, Math.floor(maxTicks));
  const raw = (hi - lo) / n;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw) ?? 10 * p;
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.round(v / step) * step);
  return out;
}

/** Fractional column of a step: inside column c (colSteps[c] <= step < colSteps[c + 1]) by its
 *  share of the column's steps; -1 before the first column. */
export function colPosition(colSteps: ArrayLike<number>, step: number, lastStep: number): number {
  const C = colSteps.length;
  let lo = 0;
  let hi = C - 1;
  if (!C || step < colSteps[0]) return -1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (colSteps[mid] <= step) lo = mid;
    else hi = mid - 1;
  }
  const end = lo + 1 < C ? colSteps[lo + 1] : lastStep + 1;
  return Math.min(lo + (end > colSteps[lo] ? (step - colSteps[lo]) / (end - colSteps[lo]) : 0), C - 0.5);
}
