// Inline SVG charts: the load bar, load over time, the contract graph and the movement
// timeline. Scales and layouts are pure functions (tested in the browser); the rest only
// turns data into SVG nodes. Colours come from CSS classes so the page's style sheet owns them.

import { s } from './dom.js';
import { clock, num, price, priceRange } from './format.js';

/** About `count` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten). */
export function ticks(lo, hi, count = 4) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((x) => x >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/** Tick times (ms) on round minutes or hours inside [start, end]. */
export function timeTicks(start, end, count = 5) {
  const steps = [10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200].map((x) => x * 1000);
  const span = end - start;
  const step = steps.find((x) => span / x <= count) || steps[steps.length - 1];
  const out = [];
  for (let t = Math.ceil(start / step) * step; t <= end; t += step) out.push(t);
  return out;
}

/** Labels for time ticks: HH:MM on whole minutes, HH:MM:SS when some tick is not on one. */
export function timeLabels(times) {
  const seconds = times.some((t) => t % 60000 !== 0);
  return times.map((t) => clock(new Date(t).toISOString()).slice(0, seconds ? 8 : 5));
}

function axisLabels(times, draw) {
  const labels = timeLabels(times);
  return times.map((t, i) => draw(t, labels[i]));
}

/** A linear map from [d0, d1] to [r0, r1]; a zero-width domain maps to r0. */
export function scale(d0, d1, r0, r1) {
  return (v) => (d1 === d0 ? r0 : r0 + ((v - d0) / (d1 - d0)) * (r1 - r0));
}

/** Points of `n` nodes evenly on a circle, the first at the top. */
export function circleLayout(n, cx, cy, r) {
  if (n === 1) return [{ x: cx, y: cy }];
  return Array.from({ length: n }, (_, i) => {
    const angle = -Math.PI / 2 + (2 * Math.PI * i) / n;
    return { x: cx + r * Math.cos(angle), y: cy + r * Math.sin(angle) };
  });
}

/** How full a participant is: 'over' its threshold, 'near' it (within 10 %), else 'ok'. */
export function loadLevel(load, threshold) {
  if (load === null || load === undefined || threshold === null || threshold === undefined) return 'unknown';
  if (load > threshold) return 'over';
  return load > 0.9 * threshold ? 'near' : 'ok';
}

/** The load of a participant against its threshold, as a horizontal bar with a marker. */
export function loadBar(load, threshold) {
  const width = 150;
  const height = 14;
  const top = Math.max(1, load ?? 0, threshold ?? 0);
  const x = scale(0, top, 0, width);
  const level = loadLevel(load, threshold);
  const label =
    load === null || load === undefined
      ? 'no load reported yet'
      : `load ${num(load)}${threshold === null || threshold === undefined ? ', no threshold reported' : ` against threshold ${num(threshold)}`}`;
  return s(
    'svg',
    { class: 'loadbar', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': label },
    s('title', {}, label),
    s('rect', { class: 'track', x: 0, y: 0, width, height, rx: 3 }),
    load === null || load === undefined ? null : s('rect', { class: `fill ${level}`, x: 0, y: 0, width: Math.max(1, x(load)), height, rx: 3 }),
    threshold === null || threshold === undefined
      ? null
      : s('line', { class: 'threshold', x1: x(threshold), x2: x(threshold), y1: -1, y2: height + 1 }),
  );
}

/**
 * Load over time for one participant: `samples` [{at (ms), load, threshold}] between
 * `start` and `end` (ms). The threshold is drawn as a dashed step line.
 */
export function loadChart(name, samples, start, end) {
  const W = 360;
  const H = 150;
  const pad = { left: 34, right: 10, top: 10, bottom: 22 };
  const shown = samples.filter((p) => p.at >= start && p.at <= end);
  const top = Math.max(1, ...shown.map((p) => p.load), ...shown.map((p) => p.threshold ?? 0));
  const x = scale(start, end, pad.left, W - pad.right);
  const y = scale(0, top, H - pad.bottom, pad.top);
  const path = (points) => points.map((p, i) => `${i ? 'L' : 'M'}${p[0].toFixed(1)},${p[1].toFixed(1)}`).join('');
  const loadPoints = shown.map((p) => [x(p.at), y(p.load)]);
  const thresholdPoints = [];
  for (const p of shown) {
    if (p.threshold === null || p.threshold === undefined) continue;
    if (thresholdPoints.length) thresholdPoints.push([x(p.at), thresholdPoints[thresholdPoints.length - 1][1]]);
    thresholdPoints.push([x(p.at), y(p.threshold)]);
  }
  const last = shown[shown.length - 1];
  const label = last
    ? `${name}: ${shown.length} load samples, last ${num(last.load)} at ${clock(new Date(last.at).toISOString())}`
    : `${name}: no load samples in this window`;
  return s(
    'svg',
    { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label },
    s('title', {}, label),
    ticks(0, top, 4).map((v) => [
      s('line', { class: 'grid', x1: pad.left, x2: W - pad.right, y1: y(v), y2: y(v) }),
      s('text', { class: 'tick', x: pad.left - 4, y: y(v) + 3, 'text-anchor': 'end' }, num(v, 1)),
    ]),
    // Ticks too near the right edge would have their labels cut off.
    axisLabels(timeTicks(start, end, 4).filter((t) => x(t) <= W - 16), (t, text) => s('text', { class: 'tick', x: x(t), y: H - 6, 'text-anchor': 'middle' }, text)),
    thresholdPoints.length ? s('path', { class: 'threshold-line', d: path(thresholdPoints) }) : null,
    loadPoints.length > 1 ? s('path', { class: 'load-line', d: path(loadPoints) }) : null,
    loadPoints.length === 1 ? s('circle', { class: 'load-dot', cx: loadPoints[0][0], cy: loadPoints[0][1], r: 3 }) : null,
    shown.length ? null : s('text', { class: 'chart-empty', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no samples in this window'),
  );
}

const NEGOTIATING = new Set(['proposed', 'countered']);

/** The point at `t` (0..1) on the quadratic curve from `a` through control point `c` to `b`. */
export function curvePoint(a, c, b, t) {
  const u = 1 - t;
  return { x: u * u * a.x + 2 * u * t * c.x + t * t * b.x, y: u * u * a.y + 2 * u * t * c.y + t * t * b.y };
}

const overlaps = (p, q) => p.x < q.x + q.w && q.x < p.x + p.w && p.y < q.y + q.h && q.y < p.y + p.h;

/**
 * Where to put each curve's label ({a, c, b, w, h}): the middle when free, else the first
 * spot further along the curve that covers no label placed before and no node (circles of
 * radius `r`). Crossing diagonals would otherwise stack their labels in the centre.
 */
export function placeLabels(curves, nodes, r) {
  const taken = nodes.map((n) => ({ x: n.x - r, y: n.y - r, w: 2 * r, h: 2 * r }));
  return curves.map(({ a, c, b, w, h }) => {
    const len = Math.hypot(b.x - a.x, b.y - a.y) || 1;
    const normal = { x: -(b.y - a.y) / len, y: (b.x - a.x) / len };
    const boxAt = ([t, off]) => {
      const p = curvePoint(a, c, b, t);
      return { x: p.x + normal.x * off - w / 2, y: p.y + normal.y * off - h / 2, w, h };
    };
    // Along the curve first; beside it only when every spot on it is covered.
    const spots = [0, h + 2, -(h + 2)].flatMap((off) => [0.5, 0.38, 0.62, 0.3, 0.7, 0.24, 0.76].map((t) => [t, off]));
    const free = spots.map(boxAt).find((box) => !taken.some((o) => overlaps(o, box)));
    const box = free || boxAt([0.5, 0]);
    taken.push(box);
    return { x: box.x + w / 2, y: box.y + h / 2 };
  });
}

/**
 * Who has contracts with whom. `participants` [{name, status}], `contracts` as the API
 * lists them; only active and negotiating contracts are drawn. `me` is highlighted.
 */
export function contractGraph(participants, contracts, me) {
  const W = 560;
  const H = 380;
  const R = 16;
  const names = participants.map((p) => p.name);
  const points = circleLayout(names.length, W / 2, H / 2, Math.min(W, H) / 2 - 60);
  const at = new Map(points.map((pt, i) => [names[i], pt]));
  const current = contracts.filter((c) => (c.state === 'active' || NEGOTIATING.has(c.state)) && at.has(c.proposer) && at.has(c.counterparty));
  const pairs = new Map();
  for (const c of current) {
    const key = [c.proposer, c.counterparty].sort().join('\u0000');
    pairs.set(key, [...(pairs.get(key) || []), c]);
  }
  const curves = [];
  for (const group of pairs.values()) {
    group.forEach((contract, k) => {
      const a = at.get(contract.proposer);
      const b = at.get(contract.counterparty);
      // Several contracts between one pair (one active, one being renegotiated) bend apart.
      const bend = (k - (group.length - 1) / 2) * 34;
      const len = Math.hypot(b.x - a.x, b.y - a.y) || 1;
      const c = { x: (a.x + b.x) / 2 - ((b.y - a.y) / len) * bend, y: (a.y + b.y) / 2 + ((b.x - a.x) / len) * bend };
      const text = `#${contract.id} ${priceRange(contract.price_min, contract.price_max)}`;
      curves.push({ contract, a, b, c, text, w: text.length * 6.6 + 8, h: 16 });
    });
  }
  const labels = placeLabels(curves, points, R + 2);
  // Lines first, then every label above every line, so no line crosses a label's text.
  const edges = curves.map(({ contract, a, b, c }) =>
    s(
      'path',
      { class: `edge ${contract.state === 'active' ? 'active' : 'negotiating'}`, d: `M${a.x},${a.y} Q${c.x},${c.y} ${b.x},${b.y}` },
      s('title', {}, `contract #${contract.id} ${contract.proposer} – ${contract.counterparty}: ${contract.state}, price ${priceRange(contract.price_min, contract.price_max)}`),
    ),
  );
  const edgeLabels = curves.map(({ text, w, h }, i) =>
    s(
      'g',
      { class: 'edge-label' },
      s('rect', { x: labels[i].x - w / 2, y: labels[i].y - h / 2, width: w, height: h, rx: 3 }),
      s('text', { x: labels[i].x, y: labels[i].y + 4, 'text-anchor': 'middle' }, text),
    ),
  );
  const nodes = participants.map((p) => {
    const pt = at.get(p.name);
    // Labels sit outside the circle of nodes so long names do not cross the edges.
    const dx = pt.x - W / 2;
    const dy = pt.y - H / 2;
    const anchor = Math.abs(dx) < 20 ? 'middle' : dx > 0 ? 'start' : 'end';
    const lx = pt.x + (anchor === 'middle' ? 0 : Math.sign(dx) * (R + 8));
    const ly = anchor === 'middle' ? pt.y + (dy < 0 ? -(R + 10) : R + 20) : pt.y + 4;
    return s(
      'g',
      { class: `node ${p.status}${p.name === me ? ' me' : ''}` },
      s('title', {}, `${p.name}: ${p.status}`),
      s('circle', { cx: pt.x, cy: pt.y, r: R }),
      s('text', { class: 'node-label', x: lx, y: ly, 'text-anchor': anchor }, p.name),
    );
  });
  const active = current.filter((c) => c.state === 'active').length;
  const label = `Contract graph: ${participants.length} participants, ${active} active contracts, ${current.length - active} being negotiated`;
  return s('svg', { class: 'graph', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label }, s('title', {}, label), edges, edgeLabels, nodes);
}

/**
 * Movements as bars on a time axis, newest on top: from `started_at` to `ended_at` (or
 * `now` while active), with the earliest end marked and the price written on the bar.
 */
export function movementTimeline(movements, now, limit = 14) {
  const recent = [...movements].sort((a, b) => b.started - a.started || b.id - a.id).slice(0, limit);
  const W = 1100;
  const rowH = 26;
  const pad = { left: 260, right: 70, top: 8, bottom: 24 };
  const H = pad.top + pad.bottom + rowH * recent.length;
  const start = Math.min(...recent.map((m) => m.started));
  const span = Math.max(now - start, 60000);
  const x = scale(now - span, now, pad.left, W - pad.right);
  const rows = recent.map((m, i) => {
    const y = pad.top + i * rowH;
    const end = m.ended ?? now;
    const x0 = x(m.started);
    const x1 = Math.max(x(end), x0 + 3);
    const what = `movement #${m.id}: task ${m.task_name} from ${m.from} to ${m.to} at ${price(m.price)}, ${m.state}`;
    return s(
      'g',
      { class: `move ${m.state}` },
      s('title', {}, what),
      s('text', { class: 'move-label', x: 8, y: y + 17 }, `#${m.id} ${m.task_name}  ${m.from} → ${m.to}`),
      s('rect', { class: 'bar', x: x0, y: y + 4, width: x1 - x0, height: rowH - 8, rx: 3 }),
      m.earliest_end <= now ? s('line', { class: 'min-end', x1: x(m.earliest_end), x2: x(m.earliest_end), y1: y + 2, y2: y + rowH - 2 }) : null,
      s('text', { class: 'move-price', x: x1 + 6, y: y + 17 }, `@ ${price(m.price)}`),
    );
  });
  const axisY = H - pad.bottom + 4;
  const label = `Timeline of the ${recent.length} most recent movements`;
  return s(
    'svg',
    { class: 'timeline', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label },
    s('title', {}, label),
    axisLabels(timeTicks(now - span, now, 8), (t, text) => [
      s('line', { class: 'grid', x1: x(t), x2: x(t), y1: pad.top, y2: axisY }),
      s('text', { class: 'tick', x: x(t), y: axisY + 14, 'text-anchor': 'middle' }, text),
    ]),
    s('line', { class: 'now', x1: x(now), x2: x(now), y1: pad.top, y2: axisY }),
    rows,
  );
}
