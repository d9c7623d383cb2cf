// The admin UI: signs in with a key, follows the registry's change feed (server-sent events),
// reads again from the JSON API the lists the feed names, and renders the views. Long lists
// come in pages. The key lives in sessionStorage (this tab only) and travels only in the
// Authorization header.

import { empty, h, replace, table } from './dom.js';
import { contractGraph, loadBar, loadChart, loadLevel, movementTimeline } from './charts.js';
import { DASH, clock, duration, ms, num, price, priceRange, refusal, when } from './format.js';

const KEY_SLOT = 'bpm.registry.key';
const RETRY_MS = 2000; // after a lost feed or a failed read; doubles up to RETRY_MAX_MS
const RETRY_MAX_MS = 30000;
const PAGE_ROWS = 50;
const EVENT_LIMIT = 500;
const SAMPLE_KEEP_MS = 2 * 3600 * 1000; // the registry keeps two hours of load samples
const VIEWS = ['participants', 'contracts', 'movements', 'ledger', 'ha', 'events'];
const NEGOTIATING = new Set(['proposed', 'countered']);
const HA_MODES = ['none', 'upstream_backup', 'passive_standby', 'active_standby'];

const $ = (id) => document.getElementById(id);

/** Everything the page knows; reset on sign-out so nothing of a session outlives it. */
function freshState() {
  return {
    key: null,
    me: null, // {operator: boolean, name: string}
    view: 'participants',
    data: {}, // the latest answer of each list endpoint
    events: [], // oldest first
    lastEventId: null,
    samples: new Map(), // participant name -> [{at (ms), iso, load, threshold}]
    ha: {}, // endpoint -> {status, body | message}
    rendered: new Map(), // container id -> JSON of the data it shows
    pages: {}, // table id -> page shown (0 first)
    totals: {}, // list read a page at a time -> its rows in all (X-Total-Count)
    clockOffset: 0, // the registry's clock minus this machine's, ms (from the feed)
    feed: null, // AbortController of the change feed's connection
    pending: new Set(), // lists to read again
    busy: false,
    retry: null, // timer of a read that failed, tried again
    generation: 0, // answers that arrive after a sign-out carry an old generation and are dropped
  };
}

let state = freshState();

// ---------------------------------------------------------------- the JSON API

class Refused extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

async function call(path, options) {
  return (await request(path, options)).payload;
}

/** The answer and, for a page of a list, how many rows the list has in all. */
async function request(path, { method = 'GET', body } = {}) {
  const init = { method, headers: { Authorization: `Bearer ${state.key}` }, cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`/api/v1${path}`, init);
  } catch (err) {
    throw new Refused(0, `cannot reach the registry (${err.message})`);
  }
  const text = await response.text();
  let payload = null;
  if (text) {
    try {
      payload = JSON.parse(text);
    } catch {
      payload = { detail: text };
    }
  }
  if (!response.ok) throw new Refused(response.status, refusal(response.status, payload), payload);
  return { payload, total: Number(response.headers.get('X-Total-Count') ?? NaN) };
}

// Who the key belongs to, as the registry says (`GET /me`): the operator, or one participant.
async function identify() {
  const me = await call('/me');
  return { operator: me.role === 'operator', name: me.name };
}

// ---------------------------------------------------------------- signing in and out

async function signIn(key) {
  state.key = key;
  state.me = await identify();
  sessionStorage.setItem(KEY_SLOT, key);
  $('signin').hidden = true;
  $('app').hidden = false;
  $('session').hidden = false;
  document.querySelector('.skip').hidden = false;
  $('who').textContent = state.me.operator ? 'Signed in as the operator' : `Signed in as ${state.me.name} (participant)`;
  buildContractForms();
  showView(viewFromHash());
  follow(state.generation);
}

function signOut(message = '') {
  state.feed?.abort();
  clearTimeout(state.retry);
  sessionStorage.removeItem(KEY_SLOT);
  const view = state.view;
  state = { ...freshState(), generation: state.generation + 1, view };
  for (const node of document.querySelectorAll('#app [id]')) {
    if (node.tagName === 'DIV' && !node.closest('nav')) node.replaceChildren();
  }
  for (const id of ['contract-message', 'contract-error']) $(id).textContent = '';
  setBanner('');
  $('app').hidden = true;
  $('session').hidden = true;
  document.querySelector('.skip').hidden = true;
  $('signin').hidden = false;
  $('signin-error').textContent = message;
  $('key').focus();
}

$('signin-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const input = $('key');
  const error = $('signin-error');
  const button = event.target.querySelector('button[type=submit]');
  const key = input.value.trim();
  error.textContent = '';
  if (!key) {
    error.textContent = 'Enter an API key.';
    input.focus();
    return;
  }
  button.disabled = true;
  try {
    await signIn(key);
    input.value = '';
  } catch (err) {
    state.key = null;
    error.textContent = err.status === 401 ? `The registry refused this key: ${err.message}.` : `Cannot sign in: ${err.message}.`;
    input.focus();
  } finally {
    button.disabled = false;
  }
});

$('sign-out').addEventListener('click', () => signOut('Signed out.'));

// ---------------------------------------------------------------- views and the change feed

function viewFromHash() {
  const name = location.hash.slice(1);
  return VIEWS.includes(name) ? name : state.view;
}

function showView(name) {
  state.view = name;
  for (const view of VIEWS) $(`view-${view}`).hidden = view !== name;
  for (const link of document.querySelectorAll('nav.views a')) {
    if (link.dataset.view === name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  render();
}

window.addEventListener('hashchange', () => {
  if (!state.me) return;
  const name = viewFromHash();
  if (name !== state.view) {
    showView(name);
    // Load history and HA records are read only while their view is shown.
    if (name === 'participants') poke(['participants']);
    if (name === 'ha') poke(['replicas', 'failovers']);
  }
});

const sleep = (delay) => new Promise((resolve) => setTimeout(resolve, delay));

/**
 * Follow the registry's change feed (GET /changes/stream): each `change` names the lists to
 * read again. A stream ends after a few minutes and is opened again at once; a lost one is
 * opened again after RETRY_MS, doubling while it fails. Its first event names every list.
 */
async function follow(generation) {
  let wait = RETRY_MS;
  while (generation === state.generation) {
    const abort = new AbortController();
    state.feed = abort;
    try {
      const response = await fetch('/api/v1/changes/stream', {
        headers: { Authorization: `Bearer ${state.key}`, Accept: 'text/event-stream' },
        cache: 'no-store',
        credentials: 'omit',
        signal: abort.signal,
      });
      if (!response.ok) {
        const text = await response.text();
        let payload;
        try {
          payload = JSON.parse(text);
        } catch {
          payload = { detail: text };
        }
        throw new Refused(response.status, refusal(response.status, payload), payload);
      }
      wait = RETRY_MS;
      await readEvents(response.body, (event, data) => onFeed(generation, event, data));
    } catch (err) {
      if (generation !== state.generation) return;
      if (err.status === 401) {
        signOut(`The registry no longer accepts this key: ${err.message}.`);
        return;
      }
      offline(`Lost the registry's change feed (${err.message}). Connecting again in ${wait / 1000} s.`);
      await sleep(wait);
      wait = Math.min(2 * wait, RETRY_MAX_MS);
    }
  }
}

/** Server-sent events from a response body: `onEvent(name, data)` for each, as it arrives. */
async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll('\r\n', '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event:')) name = line.slice(6).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
      }
      if (data.length) onEvent(name, JSON.parse(data.join('\n')));
    }
  }
}

function onFeed(generation, event, data) {
  if (generation !== state.generation) return;
  if (data.at) state.clockOffset = ms(data.at) - Date.now();
  if (event === 'revoked') signOut(`The registry no longer accepts this key: ${data.detail}.`);
  else if (event === 'change') poke(data.lists);
}

/** Read `lists` again now, or right after the read under way. */
function poke(lists) {
  for (const name of lists) state.pending.add(name);
  if (!state.busy) drain(state.generation);
}

async function drain(generation) {
  state.busy = true;
  try {
    while (state.pending.size && generation === state.generation) {
      const lists = [...state.pending];
      state.pending.clear();
      await refresh(generation, lists);
    }
  } finally {
    if (generation === state.generation) state.busy = false;
  }
}

/** The path of a list; those read a page at a time ask for their table's page, newest first. */
const PAGED = { offers: 'offers-table', movements: 'movements-table' };

function listPath(name) {
  const table = PAGED[name];
  if (!table) return `/${name}`;
  return `/${name}?limit=${PAGE_ROWS}&offset=${(state.pages[table] || 0) * PAGE_ROWS}&descending=true`;
}

async function refresh(generation, lists) {
  const names = LISTS.filter((n) => lists.includes(n));
  const eventsPath = state.lastEventId === null ? `/events?limit=${EVENT_LIMIT}` : `/events?after_id=${state.lastEventId}&limit=${EVENT_LIMIT}`;
  const reads = names.map((n) => request(listPath(n)));
  if (lists.includes('events')) reads.push(request(eventsPath));
  const answers = await Promise.allSettled(reads);
  if (generation !== state.generation) return;
  const failures = [];
  const failed = [];
  answers.forEach((answer, i) => {
    const name = names[i] ?? 'events';
    if (answer.status === 'rejected') {
      failures.push(answer.reason);
      failed.push(name);
    } else if (name === 'events') {
      mergeEvents(answer.value.payload);
    } else {
      state.data[name] = answer.value.payload;
      if (PAGED[name]) state.totals[name] = answer.value.total;
    }
  });
  if (state.view === 'participants' && state.data.participants && lists.includes('participants')) failures.push(...(await refreshSamples(pageOf('participants-table', state.data.participants))));
  if (state.view === 'ha' && (lists.includes('replicas') || lists.includes('failovers'))) await refreshHa();
  if (generation !== state.generation) return;
  const revoked = failures.find((f) => f.status === 401);
  if (revoked) {
    signOut(`The registry no longer accepts this key: ${revoked.message}.`);
    return;
  }
  if (failures.length) {
    offline(`Could not read everything: ${failures[0].message}. Trying again in ${RETRY_MS / 1000} s.`);
    clearTimeout(state.retry);
    state.retry = setTimeout(() => poke(failed.length ? failed : ['participants']), RETRY_MS);
  } else {
    setBanner('');
    const live = $('live');
    live.textContent = `live · updated ${clock(new Date(serverNow()).toISOString())}`;
    live.className = 'live ok';
  }
  render();
}

function offline(message) {
  setBanner(message);
  const live = $('live');
  live.textContent = 'offline · retrying';
  live.className = 'live offline';
}

function mergeEvents(events) {
  state.events = state.lastEventId === null ? events : [...state.events, ...events];
  state.events = state.events.slice(-EVENT_LIMIT);
  if (state.events.length) state.lastEventId = state.events[state.events.length - 1].id;
}

async function refreshSamples(participants) {
  const cutoff = serverNow() - SAMPLE_KEEP_MS;
  const answers = await Promise.allSettled(
    participants.map((p) => {
      const known = state.samples.get(p.name) || [];
      const since = known.length ? `?since=${encodeURIComponent(known[known.length - 1].iso)}` : '';
      return call(`/participants/${encodeURIComponent(p.name)}/loads${since}`);
    }),
  );
  const failures = [];
  answers.forEach((answer, i) => {
    if (answer.status === 'rejected') {
      failures.push(answer.reason);
      return;
    }
    const name = participants[i].name;
    const added = answer.value.map((x) => ({ at: ms(x.at), iso: x.at, load: x.load, threshold: x.threshold }));
    state.samples.set(name, [...(state.samples.get(name) || []), ...added].filter((x) => x.at >= cutoff));
  });
  return failures;
}

// Replicas and failovers are recorded by a later part of the registry; until those
// endpoints answer 200 the view says so instead of showing anything made up.
async function refreshHa() {
  await Promise.all(
    ['replicas', 'failovers'].map(async (name) => {
      try {
        state.ha[name] = { status: 200, body: await call(`/${name}`) };
      } catch (err) {
        state.ha[name] = { status: err.status, message: err.message };
      }
    }),
  );
}

function setBanner(text) {
  const banner = $('banner');
  banner.textContent = text;
  banner.hidden = !text;
}

/** The registry's clock (as its change feed tells it), so ages and timelines do not depend on this machine's clock. */
function serverNow() {
  return Date.now() + state.clockOffset;
}

/** Re-render a container only when what it shows changed, so focus and scroll stay put. */
function show(id, deps, build) {
  const json = JSON.stringify(deps);
  if (state.rendered.get(id) === json) return;
  state.rendered.set(id, json);
  replace($(id), build());
}

/** The rows of the page shown of a table that holds all of `rows`. */
function pageOf(id, rows) {
  const last = Math.max(0, Math.ceil(rows.length / PAGE_ROWS) - 1);
  const page = Math.min(state.pages[id] || 0, last);
  return rows.slice(page * PAGE_ROWS, (page + 1) * PAGE_ROWS);
}

/**
 * Previous and next pages of table `id`, whose list has `total` rows; nothing when one page
 * holds them all. `turn` runs after the page changed (to read a page from the registry).
 */
function pager(id, caption, total, turn = render) {
  if (total <= PAGE_ROWS) return null;
  const page = state.pages[id] || 0;
  const pages = Math.ceil(total / PAGE_ROWS);
  const go = (to) => () => {
    state.pages[id] = to;
    turn();
  };
  const first = page * PAGE_ROWS + 1;
  const last = Math.min(total, (page + 1) * PAGE_ROWS);
  return h(
    'nav',
    { class: 'pager', 'aria-label': `Pages of ${caption}` },
    h('span', { class: 'sub' }, `${first}–${last} of ${total}`),
    h('button', { type: 'button', class: 'small secondary', disabled: page === 0, dataset: { focusKey: `${id}-previous` }, onclick: go(page - 1) }, 'Previous'),
    h('button', { type: 'button', class: 'small secondary', disabled: page >= pages - 1, dataset: { focusKey: `${id}-next` }, onclick: go(page + 1) }, 'Next'),
  );
}

/**
 * A list as a table, a page at a time, or its empty state (`none`: [title, hint], or nothing)
 * when it has no rows. `rows` is the whole list, or with `total` the page the registry gave
 * of a list that many rows long (`list` names it, to read another page).
 */
function showTable(id, rows, { caption, headers, row, none, cls, total, list }) {
  const all = total ?? rows.length;
  const page = state.pages[id] || 0;
  const shown = total === undefined ? pageOf(id, rows) : rows;
  const turn = list ? () => poke([list]) : render;
  show(id, [shown, all, page], () =>
    shown.length ? [table(caption, headers, shown.map(row), { class: cls }), pager(id, caption, all, turn)] : none ? empty(...none) : [],
  );
}

const LISTS = ['participants', 'contracts', 'tasks', 'offers', 'movements', 'ledger'];

function render() {
  // Views combine several lists; draw once all of them have arrived at least once.
  if (!state.me || !LISTS.every((name) => state.data[name])) return;
  ({ participants: renderParticipants, contracts: renderContracts, movements: renderMovements, ledger: renderLedger, ha: renderHa, events: renderEvents })[state.view]();
}

// ---------------------------------------------------------------- small pieces

const badge = (text, kind = text) => h('span', { class: `badge ${kind}` }, text);
const route = (from, to) => `${from} → ${to}`;
const youMark = (name) => (state.me && name === state.me.name ? h('span', { class: 'you' }, ' (you)') : null);
// The TLS certificate its agent registered, which partners pin: the start of its SHA-256, whole in the title.
const tlsMark = (p) => (p.certificate_sha256
  ? h('div', { class: 'sub', title: `SHA-256 ${p.certificate_sha256}` }, `TLS ${p.certificate_sha256.slice(0, 16)}…`)
  : h('div', { class: 'sub' }, 'no TLS certificate'));

function marginalCost(mc) {
  if (!mc || !Object.keys(mc).length) return DASH;
  return Object.entries(mc)
    .map(([k, v]) => `${k} ${v === null ? DASH : price(v)}`)
    .join(' · ');
}

// ---------------------------------------------------------------- participants

function renderParticipants() {
  const { participants, tasks = [] } = state.data;
  show('participants-summary', [participants.map((p) => [p.name, p.status, p.load, p.threshold])], () => participantSummary(participants));
  const shown = pageOf('participants-table', participants);
  show('participants-table', [shown, participants.length, tasks], () => {
    if (!participants.length) return empty('No participants yet.', 'The operator registers them: bpm participants add NAME --endpoint URL.');
    const byId = new Map(tasks.map((t) => [t.id, t]));
    return [table(
      'Participants',
      ['Participant', 'Status', 'Load against threshold', 'Marginal cost', 'Heartbeat', 'Hosted tasks'],
      shown.map((p) => [
        h('div', {}, h('strong', {}, p.name), youMark(p.name), h('div', { class: 'sub' }, p.endpoint), tlsMark(p)),
        badge(p.status),
        h('div', { class: 'load' }, loadBar(p.load, p.threshold), h('span', { class: 'num' }, `${num(p.load)} / ${num(p.threshold)}`)),
        { cell: marginalCost(p.marginal_cost), class: 'num' },
        p.heartbeat_age_s === null ? 'never' : `${duration(p.heartbeat_age_s)} ago`,
        hostedTasks(p, byId),
      ]),
      { class: 'participants' },
    ), pager('participants-table', 'Participants', participants.length, () => poke(['participants']))];
  });
  // Charts of the participants on the table's page only: a large federation is read a page at a time.
  const windowS = Number($('load-window').value);
  const end = serverNow();
  const start = end - windowS * 1000;
  const series = shown.map((p) => [p.name, p.status, (state.samples.get(p.name) || []).filter((x) => x.at >= start).map((x) => [x.at, x.load, x.threshold])]);
  show('load-charts', [series, start], () => {
    if (!shown.length) return [];
    return shown.map((p) =>
      h(
        'figure',
        { class: 'chart-card' },
        h('figcaption', {}, h('strong', {}, p.name), ' ', badge(p.status)),
        loadChart(p.name, state.samples.get(p.name) || [], start, end),
      ),
    );
  });
}

function participantSummary(participants) {
  if (!participants.length) return [];
  const counts = {};
  for (const p of participants) counts[p.status] = (counts[p.status] || 0) + 1;
  const over = participants.filter((p) => loadLevel(p.load, p.threshold) === 'over');
  return h(
    'p',
    {},
    `${participants.length} participant${participants.length === 1 ? '' : 's'}: `,
    Object.entries(counts)
      .map(([status, n]) => `${n} ${status}`)
      .join(', '),
    '. ',
    over.length
      ? h('span', { class: 'warn' }, `Over threshold: ${over.map((p) => `${p.name} (${num(p.load)} > ${num(p.threshold)})`).join(', ')}.`)
      : 'Nobody is over its threshold.',
  );
}

function hostedTasks(participant, byId) {
  if (!participant.hosted_tasks.length) return h('span', { class: 'sub' }, 'none');
  const shown = participant.hosted_tasks.slice(0, 8).map((id) => {
    const task = byId.get(id);
    if (!task) return h('li', {}, `#${id}`);
    const away = task.origin !== participant.name;
    return h('li', { class: away ? 'away' : undefined, title: away ? `${task.name}, from ${task.origin}` : task.name }, `#${id}`, away ? ` from ${task.origin}` : null);
  });
  const more = participant.hosted_tasks.length - shown.length;
  return h('ul', { class: 'inline-list', 'aria-label': `${participant.hosted_tasks.length} hosted tasks` }, shown, more > 0 ? h('li', { class: 'sub' }, `+${more} more`) : null);
}

$('load-window').addEventListener('change', () => render());

// ---------------------------------------------------------------- contracts

function renderContracts() {
  const { participants, contracts } = state.data;
  const me = state.me.operator ? null : state.me.name;
  show('contract-graph', [participants.map((p) => [p.name, p.status]), contracts, me], () => {
    if (!participants.length) return empty('No participants yet.', 'Contracts appear here once participants sign them.');
    return contractGraph(participants, contracts, me);
  });
  const newest = [...contracts].reverse();
  const shown = pageOf('contracts-table', newest);
  show('contracts-table', [shown, contracts.length, state.pages['contracts-table'], me], () => {
    if (!contracts.length) {
      return empty('No contracts yet.', me ? 'Propose one with the form above.' : 'Participants propose them to each other (bpm contracts propose).');
    }
    const headers = ['Contract', 'Parties', 'Price range', 'Min duration', 'Valid until', 'HA mode', 'State', 'Waiting for'];
    return [table(
      'Contracts',
      me ? [...headers, 'Actions'] : headers,
      shown.map((c) => {
        const row = [
          `#${c.id}`,
          h('span', {}, route(c.proposer, c.counterparty)),
          { cell: priceRange(c.price_min, c.price_max), class: 'num' },
          { cell: duration(c.min_duration_s), class: 'num' },
          c.valid_until ? when(c.valid_until) : 'open-ended',
          c.ha_mode,
          h('span', {}, badge(c.state), c.state === 'active' && !c.in_force ? badge('expired') : null),
          c.awaiting ? h('span', {}, c.awaiting, youMark(c.awaiting)) : DASH,
        ];
        return me ? [...row, contractActions(c, me)] : row;
      }),
      { class: 'contracts' },
    ), pager('contracts-table', 'Contracts', contracts.length)];
  });
  syncContractForms();
}

function contractActions(contract, me) {
  const button = (action, text, extra = {}) =>
    h(
      'button',
      { type: 'button', class: extra.class || 'small', 'aria-label': `${text} contract #${contract.id}`, dataset: { focusKey: `${action}-${contract.id}` }, onclick: () => (extra.onclick || (() => act(contract.id, action)))() },
      text,
    );
  const buttons = [];
  if (NEGOTIATING.has(contract.state) && contract.awaiting === me) {
    buttons.push(button('accept', 'Accept'), button('reject', 'Reject', { class: 'small danger' }), button('counter', 'Counter', { class: 'small secondary', onclick: () => startCounter(contract) }));
  }
  if (NEGOTIATING.has(contract.state) || contract.state === 'active') buttons.push(button('terminate', 'Terminate', { class: 'small danger' }));
  return buttons.length ? h('div', { class: 'actions' }, buttons) : DASH;
}

const FINAL_WORDS = { reject: 'Reject', terminate: 'Terminate' };

async function act(contractId, action) {
  // Rejecting and terminating cannot be undone, so they ask first.
  if (FINAL_WORDS[action] && !window.confirm(`${FINAL_WORDS[action]} contract #${contractId}? This cannot be undone.`)) return;
  await submit(() => call(`/contracts/${contractId}/${action}`, { method: 'POST' }), (c) => `Contract #${c.id} is now ${c.state}.`);
}

/** Run an action with the signed-in key; show the outcome, or the registry's refusal word for word. */
async function submit(request, success) {
  const message = $('contract-message');
  const error = $('contract-error');
  message.textContent = '';
  error.textContent = '';
  try {
    const result = await request();
    message.textContent = success(result);
    poke(['contracts', 'events']);
    return true;
  } catch (err) {
    error.textContent = err.status ? `Refused (${err.status}): ${err.message}` : `Not sent: ${err.message}`;
    return false;
  }
}

function field(label, input) {
  return h('label', { class: 'field' }, h('span', {}, label), input);
}

const numberInput = (name, extra = {}) => h('input', { name, type: 'number', step: 'any', min: '0', required: true, inputmode: 'decimal', ...extra });

function termsFields(prefix) {
  return [
    field('Price min', numberInput('price_min', { id: `${prefix}-price-min` })),
    field('Price max', numberInput('price_max', { id: `${prefix}-price-max` })),
    field('Min duration (s)', numberInput('min_duration_s', { id: `${prefix}-duration` })),
  ];
}

function termsOf(form) {
  const data = new FormData(form);
  return { price_min: Number(data.get('price_min')), price_max: Number(data.get('price_max')), min_duration_s: Number(data.get('min_duration_s')) };
}

function buildContractForms() {
  const box = $('contract-forms');
  if (state.me.operator) {
    replace(
      box,
      h(
        'div',
        { class: 'note' },
        h('h3', {}, 'Acting on contracts'),
        h('p', {}, 'Contracts are negotiated by their two parties. Sign in with a participant\'s key to propose, counter, accept, reject or terminate; the operator watches.'),
      ),
    );
    return;
  }
  const propose = h(
    'form',
    { id: 'propose-form', class: 'card', 'aria-labelledby': 'propose-title' },
    h('h3', { id: 'propose-title' }, 'Propose a contract'),
    h('div', { class: 'fields' },
      field('Counterparty', h('select', { name: 'counterparty', id: 'propose-counterparty', required: true })),
      termsFields('propose'),
      field('Valid until (optional)', h('input', { name: 'valid_until', type: 'datetime-local', id: 'propose-valid-until' })),
      field('HA mode', h('select', { name: 'ha_mode', id: 'propose-ha-mode' }, HA_MODES.map((m) => h('option', { value: m }, m)))),
    ),
    h('button', { type: 'submit' }, 'Propose'),
  );
  propose.addEventListener('submit', async (event) => {
    event.preventDefault();
    const data = new FormData(propose);
    const body = { counterparty: data.get('counterparty'), ...termsOf(propose), ha_mode: data.get('ha_mode') };
    if (data.get('valid_until')) body.valid_until = new Date(data.get('valid_until')).toISOString();
    if (await submit(() => call('/contracts', { method: 'POST', body }), (c) => `Proposed contract #${c.id} to ${c.counterparty}; it waits for ${c.awaiting}.`)) propose.reset();
  });
  const counter = h(
    'form',
    { id: 'counter-form', class: 'card', 'aria-labelledby': 'counter-title' },
    h('h3', { id: 'counter-title' }, 'Counter a proposal'),
    h('div', { class: 'fields' }, field('Contract', h('select', { name: 'contract', id: 'counter-contract', required: true })), termsFields('counter')),
    h('button', { type: 'submit' }, 'Send counter-proposal'),
  );
  counter.addEventListener('submit', async (event) => {
    event.preventDefault();
    const id = new FormData(counter).get('contract');
    if (await submit(() => call(`/contracts/${id}/counter`, { method: 'POST', body: termsOf(counter) }), (c) => `Countered contract #${c.id}; it waits for ${c.awaiting}.`)) counter.reset();
  });
  replace(box, propose, counter);
}

/** Keep the forms' choices current without disturbing what is being typed. */
function syncContractForms() {
  if (state.me.operator) return;
  const me = state.me.name;
  syncOptions($('propose-counterparty'), state.data.participants.filter((p) => p.name !== me).map((p) => [p.name, p.name]), 'nobody else yet');
  const awaiting = state.data.contracts.filter((c) => NEGOTIATING.has(c.state) && c.awaiting === me);
  syncOptions($('counter-contract'), awaiting.map((c) => [String(c.id), `#${c.id} with ${c.proposer === me ? c.counterparty : c.proposer} (${priceRange(c.price_min, c.price_max)})`]), 'no proposal waits for you');
}

function syncOptions(select, options, none) {
  const json = JSON.stringify(options);
  if (select.dataset.options === json) return;
  select.dataset.options = json;
  const keep = select.value;
  select.replaceChildren(...(options.length ? options.map(([value, label]) => h('option', { value }, label)) : [h('option', { value: '' }, none)]));
  if (options.some(([value]) => value === keep)) select.value = keep;
}

function startCounter(contract) {
  const select = $('counter-contract');
  select.value = String(contract.id);
  $('counter-price-min').value = contract.price_min;
  $('counter-price-max').value = contract.price_max;
  $('counter-duration').value = contract.min_duration_s;
  $('counter-price-min').focus();
}

// ---------------------------------------------------------------- tasks and movements

function renderMovements() {
  const { movements, tasks, offers } = state.data;
  const now = serverNow();
  // The movements and offers shown are the registry's page of them, newest first.
  show('movement-timeline', [movements, Math.round(now / 1000)], () => {
    if (!movements.length) return empty('No movements yet.', 'A movement starts when a partner accepts an offer of tasks.');
    const rows = movements.map((m) => ({ ...m, started: ms(m.started_at), ended: ms(m.ended_at), earliest_end: ms(m.earliest_end_at) }));
    const key = (kind, text) => [h('span', { class: `key ${kind}` }), text];
    return [movementTimeline(rows, now), h('p', { class: 'legend', 'aria-hidden': 'true' }, key('active', 'running'), key('ended', 'ended'), key('min-end', 'earliest end'), key('now', 'now'))];
  });
  showTable('movements-table', movements, {
    caption: 'Movements',
    total: state.totals.movements,
    list: 'movements',
    headers: ['Movement', 'Task', 'From → to', 'Price', 'Load', 'Started', 'Earliest end', 'Ended', 'State', 'Accrued'],
    cls: 'movements',
    row: (m) => [
      `#${m.id}`,
      `#${m.task_id} ${m.task_name}`,
      route(m.from, m.to),
      { cell: price(m.price), class: 'num' },
      { cell: num(m.load), class: 'num' },
      when(m.started_at),
      when(m.earliest_end_at),
      m.ended_at ? when(m.ended_at) : DASH,
      badge(m.state),
      { cell: num(m.accrued), class: 'num' },
    ],
  });
  showTable('tasks-table', tasks, {
    caption: 'Tasks',
    headers: ['Task', 'Origin', 'Runs at', 'Load', 'HA mode', 'Epoch', 'Split or merged from'],
    cls: 'tasks',
    none: ['No tasks yet.', 'Each participant registers its own tasks; they start at home.'],
    row: (t) => [
      h('span', {}, `#${t.id} ${t.name}`, t.retired ? badge('retired') : t.until_s != null ? badge(`ends at ${t.until_s}`, 'ending') : null),
      t.origin,
      h('span', {}, t.host, t.away ? badge('away') : null),
      { cell: num(t.load), class: 'num' },
      t.ha_mode,
      { cell: String(t.epoch), class: 'num' },
      t.from_tasks && t.from_tasks.length ? `${t.from_tasks.map((i) => `#${i}`).join(', ')} from ${t.since_s}` : DASH,
    ],
  });
  showTable('offers-table', offers, {
    caption: 'Offers',
    total: state.totals.offers,
    list: 'offers',
    headers: ['Offer', 'From → to', 'Tasks', 'Price (offered up to)', 'State', 'Reason', 'Made at'],
    cls: 'offers',
    none: ['No offers yet.', 'An overloaded participant offers tasks to a contract partner.'],
    row: (o) => [
      `#${o.id}`,
      route(o.from, o.to),
      (o.accepted_task_ids || o.task_ids).map((id) => `#${id}`).join(' '),
      { cell: o.settled_price == null ? `(${price(o.price)})` : `${price(o.settled_price)} (${price(o.price)})`, class: 'num' },
      badge(o.state),
      o.reason || DASH,
      when(o.created_at),
    ],
  });
}

// ---------------------------------------------------------------- ledger

function renderLedger() {
  const { ledger } = state.data;
  show('ledger-balances', [ledger.balances], () => {
    if (!ledger.entries.length) return empty('No payments yet.', 'The ledger fills as soon as a movement starts: the side that moved the task pays the side that runs it price × load × seconds away.');
    return [
      h('p', { class: 'summary' }, `As of ${clock(ledger.as_of)}. Whoever moved a task pays whoever runs it price × load × seconds away; a host that passed a task on pays the next host and is still paid by the one before.`),
      table(
        'Balances',
        ['Participant', 'Paid', 'Earned', 'Balance'],
        ledger.balances.map((b) => [
          h('span', {}, b.participant, youMark(b.participant)),
          { cell: num(b.paid), class: 'num' },
          { cell: num(b.earned), class: 'num' },
          { cell: (b.balance > 0 ? '+' : '') + num(b.balance), class: `num ${b.balance < 0 ? 'neg' : 'pos'}` },
        ]),
        { class: 'balances' },
      ),
    ];
  });
  showTable('ledger-entries', [...ledger.entries].reverse(), {
    caption: 'Ledger entries',
    headers: ['Movement', 'Task', 'Payer → payee', 'Price', 'Load', 'Seconds', 'Amount', 'State'],
    cls: 'entries',
    row: (e) => [
      `#${e.movement_id}`,
      `#${e.task_id}`,
      route(e.from, e.to),
      { cell: price(e.price), class: 'num' },
      { cell: num(e.load), class: 'num' },
      { cell: num(e.seconds, 0), class: 'num' },
      { cell: num(e.amount), class: 'num' },
      badge(e.state),
    ],
  });
}

// ---------------------------------------------------------------- HA

function renderHa() {
  const { contracts, tasks } = state.data;
  show('ha-asked', [contracts, tasks], () => haAsked(contracts, tasks));
  show('ha-replicas', [state.ha.replicas], () => haRecords('replicas', state.ha.replicas, ['task_id', 'task']));
  show('ha-failovers', [state.ha.failovers], () => haRecords('failovers', state.ha.failovers, ['at', 'started_at', 'id']));
}

/** What the contracts and tasks ask for: the registry's own data, shown whether or not replicas are recorded. */
function haAsked(contracts, tasks) {
  const wanting = contracts.filter((c) => c.ha_mode !== 'none' && (c.state === 'active' || NEGOTIATING.has(c.state)));
  const tasksWanting = tasks.filter((t) => t.ha_mode !== 'none');
  if (!wanting.length && !tasksWanting.length) return h('p', { class: 'summary' }, 'No contract or task asks for an HA mode.');
  return h(
    'ul',
    { class: 'summary plain' },
    wanting.map((c) => h('li', {}, `Contract #${c.id} ${c.proposer} – ${c.counterparty} (${c.state}) asks for `, h('strong', {}, c.ha_mode), '.')),
    tasksWanting.map((t) => h('li', {}, `Task #${t.id} ${t.name} at ${t.host} asks for `, h('strong', {}, t.ha_mode), '.')),
  );
}

/** HA records as the registry gives them: their shape is the registry's, so columns follow the data. */
function haRecords(name, answer, sortKeys) {
  if (!answer) return h('p', { class: 'sub' }, 'Loading…');
  if (answer.status !== 200) {
    return empty('No HA records yet.', `The registry does not record ${name} yet (GET /api/v1/${name} answered ${answer.status || 'nothing'}: ${answer.message}).`);
  }
  let rows = answer.body;
  if (rows && !Array.isArray(rows) && typeof rows === 'object') rows = Object.values(rows).find(Array.isArray) ?? [rows];
  if (!Array.isArray(rows) || !rows.length) return empty(`No ${name} recorded.`, name === 'replicas' ? 'Moved tasks with an HA mode get replicas here.' : 'Failovers and repairs appear when a host fails.');
  const key = sortKeys.find((k) => rows.some((r) => r && k in r));
  if (key) rows = [...rows].sort((a, b) => String(a[key]).localeCompare(String(b[key]), undefined, { numeric: true }));
  const columns = [...new Set(rows.flatMap((r) => Object.keys(r || {})))];
  const text = (v) => (v === null || v === undefined ? DASH : typeof v === 'object' ? JSON.stringify(v) : String(v));
  return table(name, columns.map((c) => c.replaceAll('_', ' ')), rows.map((r) => columns.map((c) => text(r[c]))), { class: `ha ${name}` });
}

// ---------------------------------------------------------------- the record

function renderEvents() {
  show('events-list', [state.events.length ? state.events[state.events.length - 1].id : null, state.events.length], () => {
    if (!state.events.length) return empty('Nothing recorded yet.', 'Registrations, negotiation steps, offers, refusals and movements are recorded here.');
    return h(
      'ol',
      { class: 'events' },
      [...state.events].reverse().slice(0, 200).map((e) =>
        h(
          'li',
          {},
          h('time', { datetime: e.at }, when(e.at)),
          badge(e.kind, `kind ${e.kind.split('.')[0]}`),
          h('span', { class: 'event-text' }, e.message),
        ),
      ),
    );
  });
}

// ---------------------------------------------------------------- start

(async function start() {
  const key = sessionStorage.getItem(KEY_SLOT);
  if (!key) {
    $('key').focus();
    return;
  }
  try {
    await signIn(key);
  } catch (err) {
    if (err.status === 401) sessionStorage.removeItem(KEY_SLOT);
    state.key = null;
    $('signin-error').textContent = `Cannot sign in again: ${err.message}.`;
    $('key').focus();
  }
})();
