// Plain SVG line charts for the console, drawn by this small module: the
// console has no build step and no npm by design, so no chart library.
// chartSvg() returns the markup of one chart (lines over a time axis, a
// value axis from 0, dots on the newest points); nearestIndex() finds the
// point under the pointer for a tooltip. Pure functions: no DOM access.

import { esc } from "./base.js";

/** The drawing's own units (the SVG scales to its box; text stays legible at 300-900 px). */
export const WIDTH = 640;
export const HEIGHT = 150;
export const PAD = { left: 42, right: 12, top: 10, bottom: 22 };

/** The smallest "round" number (1, 2, 2.5, 5 x 10^n) at or above `value` (1 for 0). */
export function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * power >= value - 1e-9) return m * power;
  return 10 * power;
}

/** A number for an axis or a tooltip: "12", "1.5k", "0.42". */
export function shortNumber(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  const abs = Math.abs(value);
  if (abs >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
  if (abs >= 1e4) return `${+(value / 1e3).toFixed(1)}k`;
  if (Number.isInteger(value)) return String(value);
  return String(+value.toFixed(2));
}

/** "14:05" for a range within a day, "12-01 14:05" for longer ones (local time). */
export function timeLabel(seconds, spanSeconds) {
  const d = new Date(seconds * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  if (spanSeconds <= 3600) return `${hm}:${pad(d.getSeconds())}`;
  return spanSeconds <= 86400 ? hm : `${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hm}`;
}

/**
 * The path of one line through `points` ([[t, value], ...], by time): a
 * missing value, or more than `gapSeconds` between two points, lifts the pen.
 */
export function linePath(points, x, y, gapSeconds) {
  let d = "";
  let previous = null;
  for (const [t, value] of points) {
    if (value === null || value === undefined) {
      previous = null;
      continue;
    }
    d += `${previous === null || t - previous > gapSeconds ? "M" : "L"}${x(t).toFixed(1)},${y(value).toFixed(1)}`;
    previous = t;
  }
  return d;
}

/** The scales of a chart over [start, end] seconds and values 0..top. */
export function scales(start, end, top) {
  const span = Math.max(end - start, 1e-9);
  const x = (t) => PAD.left + ((t - start) / span) * (WIDTH - PAD.left - PAD.right);
  const y = (v) => HEIGHT - PAD.bottom - (v / top) * (HEIGHT - PAD.top - PAD.bottom);
  return { x, y };
}

/**
 * One chart's SVG markup.
 * lines: [{field, label, tone, dashed, points: [[t, value], ...]}]; start, end: seconds; step: seconds.
 * Each line's <path> carries data-field and data-values (the values drawn, in order).
 */
export function chartSvg({ lines, start, end, step, title }) {
  const values = lines.flatMap((line) => line.points.map((p) => p[1]).filter((v) => v !== null && v !== undefined));
  const top = niceMax(Math.max(0, ...values));
  const { x, y } = scales(start, end, top);
  const gap = step * 1.5;
  const grid = [0, top / 2, top]
    .map((v) => `<line class="grid" x1="${PAD.left}" x2="${WIDTH - PAD.right}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}"></line>
      <text class="axis" x="${PAD.left - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end">${esc(shortNumber(v))}</text>`)
    .join("");
  const span = end - start;
  const ticks = [start, start + span / 2, end]
    .map((t, i) => `<text class="axis" x="${x(t).toFixed(1)}" y="${HEIGHT - 6}" text-anchor="${["start", "middle", "end"][i]}">${esc(timeLabel(t, span))}</text>`)
    .join("");
  const paths = lines
    .map((line) => {
      const drawn = line.points.filter((p) => p[1] !== null && p[1] !== undefined);
      const last = drawn[drawn.length - 1];
      const dot = last ? `<circle class="dot ${line.tone}" cx="${x(last[0]).toFixed(1)}" cy="${y(last[1]).toFixed(1)}" r="2.6"></circle>` : "";
      return `<path class="line ${line.tone}${line.dashed ? " dashed" : ""}" data-field="${esc(line.field)}"
        data-values="${esc(drawn.map((p) => p[1]).join(","))}" d="${linePath(line.points, x, y, gap)}"></path>${dot}`;
    })
    .join("");
  return `<svg viewBox="0 0 ${WIDTH} ${HEIGHT}" role="img" aria-label="${esc(title)}" data-top="${top}">
    ${grid}${ticks}${paths}
    <line class="cursor" data-cursor x1="0" x2="0" y1="${PAD.top}" y2="${HEIGHT - PAD.bottom}" visibility="hidden"></line>
    <rect class="hover" x="${PAD.left}" y="${PAD.top}" width="${WIDTH - PAD.left - PAD.right}" height="${HEIGHT - PAD.top - PAD.bottom}"></rect>
  </svg>`;
}

/** The index of the point whose time is nearest `t` (times sorted), or -1. */
export function nearestIndex(times, t) {
  if (!times.length) return -1;
  let lo = 0;
  let hi = times.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (times[mid] <= t) lo = mid;
    else hi = mid;
  }
  return Math.abs(times[lo] - t) <= Math.abs(times[hi] - t) ? lo : hi;
}
