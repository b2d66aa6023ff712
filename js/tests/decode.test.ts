import { describe, expect, it } from "vitest";
import { asFloat32, asFloat64, asUint32, asUint8, byteLength, bytesOf, matrix } from "../src/decode";

function f32bytes(values: number[]): Uint8Array {
  return new Uint8Array(new Float32Array(values).buffer);
}

describe("decode", () => {
  it("reads a DataView at an aligned offset without copying", () => {
    const buf = new ArrayBuffer(24);
    new Float32Array(buf, 8, 4).set([1, 2, 3, 4]);
    const dv = new DataView(buf, 8, 16);
    const a = asFloat32(dv, 4);
    expect(Array.from(a)).toEqual([1, 2, 3, 4]);
    expect(a.buffer).toBe(buf); // a view, not a copy
  });

  it("copies a DataView whose offset is not a multiple of 4", () => {
    const bytes = f32bytes([0.5, -2, 1e-8]);
    const buf = new ArrayBuffer(bytes.length + 3);
    new Uint8Array(buf, 3).set(bytes);
    const dv = new DataView(buf, 3, bytes.length);
    const a = asFloat32(dv);
    expect(a.length).toBe(3);
    expect(a[0]).toBe(0.5);
    expect(a[1]).toBe(-2);
    expect(a[2]).toBeCloseTo(1e-8, 12);
    expect(a.buffer).not.toBe(buf);
  });

  it("accepts a raw ArrayBuffer (Colab) and typed arrays", () => {
    const raw = new Float64Array([3, 1e12, -7]).buffer;
    expect(Array.from(asFloat64(raw))).toEqual([3, 1e12, -7]);
    expect(Array.from(asUint32(new Uint32Array([7, 8])))).toEqual([7, 8]);
    expect(Array.from(asUint8(new DataView(new Uint8Array([1, 2, 255]).buffer))).slice(-1)).toEqual([255]);
  });

  it("treats null and undefined as empty", () => {
    expect(asFloat32(null).length).toBe(0);
    expect(byteLength(undefined)).toBe(0);
    expect(bytesOf(null)[2]).toBe(0);
  });

  it("rejects lengths that are not whole values or not the expected count", () => {
    expect(() => asFloat32(new ArrayBuffer(6))).toThrow(/whole number/);
    expect(() => asFloat32(new ArrayBuffer(8), 3)).toThrow(/expected 3 values, got 2/);
    expect(() => asFloat32({} as unknown as ArrayBuffer)).toThrow(TypeError);
  });

  it("keeps NaN and Inf", () => {
    const a = asFloat32(new DataView(new Float32Array([NaN, Infinity, -Infinity]).buffer));
    expect(Number.isNaN(a[0])).toBe(true);
    expect(a[1]).toBe(Infinity);
    expect(a[2]).toBe(-Infinity);
  });

  it("builds a row-major matrix", () => {
    const m = matrix(new Float32Array([1, 2, 3, 4, 5, 6]).buffer, 2, 3);
    expect(m.rows).toBe(2);
    expect(m.data[1 * 3 + 2]).toBe(6);
    expect(matrix(null, 0, 5).data.length).toBe(0);
  });
});
