// A layer name in at most `width` characters, keeping what tells it from its neighbours: the
// parameter ("weight"), its module ("c_attn") and every block index with the word before it
// ("h.3"); the other parts of the path go first, the outermost first
// ("transformer.h.3.attn.c_attn.weight" -> "…h.3…c_attn.weight"), then the block words, then the
// module; a name still too long is cut in the middle. The kernel's copy is
// gradwidget/plots/common.py `elide`; js/tests/names.cases.json holds cases both must give.

function joined(parts: string[], kept: boolean[]): string {
  let out = "";
  let gap = false;
  parts.forEach((p, i) => {
    if (!kept[i]) {
      gap = true;
      return;
    }
    out += (gap ? "…" : out ? "." : "") + p;
    gap = false;
  });
  return out + (gap ? "…" : "");
}

export function elide(name: string, width = 28, keep: ReadonlySet<string> = new Set()): string {
  // lengths in code points, as Python's len()
  const len = (s: string) => Array.from(s).length;
  if (len(name) <= width) return name;
  const parts = name.split(".");
  const n = parts.length;
  const index = new Set<number>();
  parts.forEach((p, i) => /^[0-9]+$/.test(p) && index.add(i));
  const before = new Set<number>();
  for (const i of index) if (i > 0 && !index.has(i - 1)) before.add(i - 1);
  const leaf = new Set<number>(n > 2 ? [n - 1, n - 2] : parts.map((_, i) => i));
  const order: number[] = [];
  for (let i = 0; i < n; i++) if (!index.has(i) && !before.has(i) && !leaf.has(i)) order.push(i);
  for (const i of [...before].sort((a, b) => a - b)) if (!leaf.has(i)) order.push(i);
  for (const i of [...leaf].sort((a, b) => a - b)) if (i !== n - 1) order.push(i);
  const kept = parts.map(() => true);
  let text = name;
  // the parts in `keep` (what tells a name from others that would read the same) stay: a name still
  // too long is cut in the middle
  for (const i of order.filter((i) => !keep.has(parts[i]))) {
    kept[i] = false;
    text = joined(parts, kept);
    if (len(text) <= width) return text;
  }
  const cps = Array.from(text);
  if (cps.length > width) {
    const tail = Math.floor((width - 1) / 2) + ((width - 1) % 2);
    return cps.slice(0, width - 1 - tail).join("") + "…" + cps.slice(cps.length - tail).join("");
  }
  return text;
}

/** `elide` of every name, where names whose labels would read the same keep the parts that tell
 *  them apart ("…layer.0…dense.weight" three times in a BERT block reads
 *  "…attention.output.dense.weight", "…intermediate.dense.weight", "…output.dense.weight"). */
export function distinctLabels(names: readonly string[], width = 28): string[] {
  if (memo && memo.names === names && memo.width === width) return memo.out;  // every redraw asks again
  const out = names.map((n) => elide(n, width));
  const same = new Map<string, number[]>();
  out.forEach((label, i) => same.set(label, [...(same.get(label) ?? []), i]));
  for (const group of same.values()) {
    if (group.length < 2) continue;
    const parts = group.map((i) => names[i].split("."));
    group.forEach((i, k) => {
      // this name's parts that some other name of the group does not have
      const own = new Set(parts[k].filter((p) => parts.some((o, j) => j !== k && !o.includes(p))));
      out[i] = elide(names[i], width, own);
    });
  }
  memo = { names, width, out };
  return out;
}

let memo: { names: readonly string[]; width: number; out: string[] } | null = null;
