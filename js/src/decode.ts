// Decoding binary traits. anywidget hands `bytes` traits to the front end as a DataView (JupyterLab,
// Notebook 7, VS Code); some hosts give a raw ArrayBuffer or a typed array. A view whose byte offset
// is not a multiple of the element size cannot back a typed array directly, so it is copied.

export type Binary = DataView | ArrayBuffer | ArrayBufferView | null | undefined;

type TypedCtor<T> = {
  new (buffer: ArrayBufferLike, byteOffset?: number, length?: number): T;
  new (length: number): T;
  BYTES_PER_ELEMENT: number;
};

/** The bytes of any binary trait value as [buffer, byteOffset, byteLength]; empty for null. */
export function bytesOf(v: Binary): [ArrayBufferLike, number, number] {
  if (v == null) return [new ArrayBuffer(0), 0, 0];
  if (v instanceof ArrayBuffer) return [v, 0, v.byteLength];
  if (ArrayBuffer.isView(v)) return [v.buffer, v.byteOffset, v.byteLength];
  // SharedArrayBuffer or a foreign-realm buffer
  const any = v as unknown as { byteLength?: number };
  if (typeof any.byteLength === "number") return [v as unknown as ArrayBufferLike, 0, any.byteLength];
  throw new TypeError("gradwidget: expected binary data (DataView or ArrayBuffer)");
}

function view<T>(ctor: TypedCtor<T>, v: Binary, expected?: number): T {
  const [buf, off, len] = bytesOf(v);
  const size = ctor.BYTES_PER_ELEMENT;
  if (len % size !== 0) {
    throw new RangeError(`gradwidget: ${len} bytes is not a whole number of ${size}-byte values`);
  }
  const n = len / size;
  if (expected !== undefined && n !== expected) {
    throw new RangeError(`gradwidget: expected ${expected} values, got ${n}`);
  }
  if (off % size === 0) return new ctor(buf, off, n);
  const copy = new Uint8Array(len);
  copy.set(new Uint8Array(buf, off, len));
  return new ctor(copy.buffer, 0, n);
}

export const asFloat32 = (v: Binary, n?: number) => view(Float32Array, v, n);
export const asFloat64 = (v: Binary, n?: number) => view(Float64Array, v, n);
export const asUint32 = (v: Binary, n?: number) => view(Uint32Array, v, n);
export const asUint8 = (v: Binary, n?: number) => view(Uint8Array, v, n);

/** Byte length of a binary trait value (0 for null/undefined). */
export function byteLength(v: Binary): number {
  return bytesOf(v)[2];
}

/** A row-major (rows x cols) matrix: row r is layer r in depth order. */
export interface Matrix {
  rows: number;
  cols: number;
  data: Float32Array;
}

export function matrix(v: Binary, rows: number, cols: number): Matrix {
  if (rows * cols === 0) return { rows: 0, cols: 0, data: new Float32Array(0) };
  return { rows, cols, data: asFloat32(v, rows * cols) };
}
