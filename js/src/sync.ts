// Optimistic two-way sync: the user's latest choice (a scrubbed step, a selected layer) is applied
// to the view at once and kept until the kernel agrees with it.
//
// While a cell runs, the kernel handles no message from the browser (they wait in its queue until
// the cell ends), yet it keeps sending updates: with `follow` still on, every update carries the
// newest step and would pull a scrubbed cursor back. ipywidgets drops only stale *echoes* of our
// own changes, not these updates, so the view filters them here.
//
// A step or layer that comes with new data (`meta` in the same update: the kernel's throttled
// push) gives way to a pending choice unless it agrees with it; one that comes alone (an echo of
// our own message, or `panel.step = ...` in Python) is the kernel's answer and always applies.
// An echo of the value the view already holds fires no change event, so agreement alone could
// leave a choice pending forever.

export class Intent {
  /** user step the cursor was scrubbed to (null: none pending) */
  step: number | null = null;
  /** the scrub went to the newest column: follow new steps */
  follow = false;
  /** layer the user selected (null: none pending) */
  layer: number | null = null;

  scrubbed(step: number, follow: boolean): void {
    this.step = step;
    this.follow = follow;
  }

  selected(layer: number): void {
    this.layer = layer;
  }

  /** The kernel's `step` changed (`withData`: in an update that carried new data): should the view
   *  take it? Yes when it came alone, agrees with the pending scrub, or nothing is pending. */
  kernelStep(step: number, withData = true): boolean {
    if (this.step === null) return true;
    if (!withData || step === this.step || (this.follow && step >= this.step)) {
      this.step = null;
      return true;
    }
    return false;
  }

  /** The kernel's `layer` changed: should the view take it? (as ``kernelStep``) */
  kernelLayer(layer: number, withData = true): boolean {
    if (this.layer === null) return true;
    if (!withData || layer === this.layer) {
      this.layer = null;
      return true;
    }
    return false;
  }

  /** Cursor column: the pending choice if any, else the kernel's step (`colFor` maps a step to a column). */
  cursor(cols: number, kernelStep: number, colFor: (step: number) => number): number {
    if (this.step === null) return colFor(kernelStep);
    return this.follow ? Math.max(0, cols - 1) : colFor(this.step);
  }
}
