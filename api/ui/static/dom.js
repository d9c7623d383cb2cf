// Building DOM and SVG nodes from data. Text always goes in as text nodes, never as markup,
// so names, reasons and messages from the registry cannot inject anything into the page.

const SVG_NS = 'http://www.w3.org/2000/svg';

function build(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') node.addEventListener(name.slice(2), value);
    else if (name === 'dataset') Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** An HTML element: h('td', {class: 'num'}, '0.5'). */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element: s('line', {x1: 0, y1: 0, x2: 10, y2: 0}). */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/**
 * Replace a container's content, keeping keyboard focus on the element with the same
 * data-focus-key if there was one: live refreshes must not throw a keyboard user out.
 */
export function replace(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.focusKey : undefined;
  container.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  if (key) {
    const again = container.querySelector(`[data-focus-key="${CSS.escape(key)}"]`);
    if (again) again.focus();
  }
}

/** A table with a header row; `rows` are arrays of cells (a cell is a node, text, or {cell, class}). */
export function table(caption, headers, rows, attrs = {}) {
  const cell = (tag, c) => {
    const scope = tag === 'th' ? 'col' : undefined;
    return c && typeof c === 'object' && 'cell' in c ? h(tag, { class: c.class, scope }, c.cell) : h(tag, { scope }, c);
  };
  return h(
    'div',
    { class: 'table-wrap' },
    h(
      'table',
      attrs,
      caption ? h('caption', { class: 'visually-hidden' }, caption) : null,
      h('thead', {}, h('tr', {}, headers.map((x) => cell('th', x)))),
      h('tbody', {}, rows.map((row) => h('tr', {}, row.map((c) => cell('td', c))))),
    ),
  );
}

/** A clear empty state: what is missing and how it gets there. */
export function empty(title, hint) {
  return h('div', { class: 'empty' }, h('p', { class: 'empty-title' }, title), hint ? h('p', {}, hint) : null);
}
