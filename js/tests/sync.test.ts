import { describe, expect, it } from "vitest";
import { Intent } from "../src/sync";

// columns start at steps 0, 10, 20, 30 (a step maps to the column it falls in)
const colSteps = [0, 10, 20, 30];
const colFor = (s: number) => {
  let c = 0;
  for (let i = 0; i < colSteps.length; i++) if (colSteps[i] <= s) c = i;
  return c;
};

describe("optimistic sync while the kernel is busy", () => {
  it("takes the kernel's step when nothing is pending", () => {
    const it_ = new Intent();
    expect(it_.kernelStep(30)).toBe(true);
    expect(it_.cursor(4, 30, colFor)).toBe(3);
  });

  it("keeps a scrubbed cursor while a busy, still-following kernel sends newer steps", () => {
    const i = new Intent();
    i.scrubbed(10, false);
    expect(i.cursor(4, 39, colFor)).toBe(1); // the view moved at once
    for (const s of [39, 45, 52]) expect(i.kernelStep(s)).toBe(false); // updates from the training loop
    expect(i.cursor(4, 52, colFor)).toBe(1);
    expect(i.kernelStep(10)).toBe(true); // the cell ended: the kernel took the scrub (its echo)
    expect(i.step).toBeNull();
    expect(i.kernelStep(11)).toBe(true); // later kernel changes (panel.step = ...) apply again
  });

  it("back to the newest column follows again, ignoring a kernel that still holds an old scrub", () => {
    const i = new Intent();
    i.scrubbed(30, true);
    expect(i.cursor(4, 12, colFor)).toBe(3);
    expect(i.kernelStep(12)).toBe(false); // the kernel's stale, not-following step
    expect(i.cursor(5, 12, colFor)).toBe(4); // a new column arrived: the cursor stays on the newest
    expect(i.kernelStep(41)).toBe(true); // the kernel follows: newer than the scrub
    expect(i.step).toBeNull();
  });

  it("takes a step or layer that comes alone: the kernel's answer (an echo, or panel.step = ... in Python)", () => {
    const i = new Intent();
    i.scrubbed(10, false);
    expect(i.kernelStep(52, true)).toBe(false); // with new data: a stale follow
    expect(i.kernelStep(20, false)).toBe(true); // alone: panel.step = 20 after the cell
    expect(i.step).toBeNull();
    i.selected(3);
    expect(i.kernelLayer(1, true)).toBe(false);
    expect(i.kernelLayer(1, false)).toBe(true);
    expect(i.layer).toBeNull();
  });

  it("keeps a selected layer until the kernel has it", () => {
    const i = new Intent();
    expect(i.kernelLayer(2)).toBe(true);
    i.selected(5);
    expect(i.kernelLayer(2)).toBe(false);
    expect(i.kernelLayer(5)).toBe(true);
    expect(i.kernelLayer(1)).toBe(true);
  });
});
