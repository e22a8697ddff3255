// zonegate dashboard: reads the admin API every 2 s with the token kept in
// local storage (never in a URL); renders with textContent only.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const KEY = 'zonegate.admin-token';
const REFRESH_MS = 2000;
const TREND_POINTS = 60;
const CUTOFF = 0.4;

const trends = new Map();
let me = null;
let timer = null;
let view = { version: null, zones: {} };
let pending = null;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids) {
    e.append(k instanceof Node ? k : document.createTextNode(k == null ? '-' : String(k)));
  }
  return e;
}

function text(id, value) { $(id).textContent = value == null ? '-' : String(value); }

function when(ms) { return ms ? new Date(ms).toLocaleTimeString() : '-'; }

function age(ms) {
  if (ms == null) return '-';
  if (ms < 1000) return '0 s';
  const s = Math.round(ms / 1000);
  return s < 120 ? s + ' s' : Math.round(s / 60) + ' min';
}

function label(x) {
  if (x == null) return '-';
  return typeof x === 'object' ? (x.status || x.mode || JSON.stringify(x)) : String(x);
}

function zoneStatus(z) {
  if (!z) return '-';
  return z.status === 'failed_over' ? 'failed over to ' + z.target : label(z);
}

async function api(path, options) {
  const token = localStorage.getItem(KEY) || '';
  const resp = await fetch(path, Object.assign({
    cache: 'no-store',
    credentials: 'omit',
    referrerPolicy: 'no-referrer',
  }, options || {}, {
    headers: { 'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json' },
  }));
  if (resp.status === 401) {
    signOut('The token was refused: sign in again.');
    throw new Error('unauthorized');
  }
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const err = new Error((body.error && body.error.message) || resp.statusText);
    err.code = body.error && body.error.code;
    throw err;
  }
  return body;
}

function showLogin(message) {
  clearTimeout(timer);
  $('app').hidden = true;
  $('logout').hidden = true;
  $('login').hidden = false;
  text('status', 'not signed in');
  $('login-error').textContent = message || '';
  $('token').focus();
}

function signOut(message) {
  localStorage.removeItem(KEY);
  me = null;
  showLogin(message);
}

async function signIn(token) {
  localStorage.setItem(KEY, token);
  try {
    me = await api('/admin/v1/whoami');
  } catch (e) {
    if (e.message !== 'unauthorized') showLogin('Cannot reach the admin API: ' + e.message);
    return;
  }
  $('login').hidden = true;
  $('app').hidden = false;
  $('logout').hidden = false;
  $('actions').hidden = me.role !== 'operator';
  refresh();
}

async function refresh() {
  clearTimeout(timer);
  try {
    const [cluster, backends, decisions, events, rules, shadows, spend] = await Promise.all([
      api('/admin/v1/cluster'),
      api('/admin/v1/backends'),
      api('/admin/v1/decisions?limit=15'),
      api('/admin/v1/events'),
      api('/admin/v1/rules'),
      api('/admin/v1/shadows'),
      api('/admin/v1/spend?since=24h'),
    ]);
    renderCluster(cluster);
    renderBackends(backends);
    renderPolicy(rules, shadows);
    renderSpend(spend);
    renderDecisions(decisions.decisions || []);
    renderEvents((events.events || []).slice(0, 15));
    const s = $('status');
    s.textContent = (me ? me.name + ' (' + me.role + ') · ' : '') + 'updated ' + new Date().toLocaleTimeString();
    s.className = 'muted';
  } catch (e) {
    if (e.message === 'unauthorized') return;
    const s = $('status');
    s.textContent = 'stale: ' + e.message;
    s.className = 'bad';
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function renderCluster(c) {
  text('node', 'node ' + c.node_id + ' · ' + c.zone);
  let leader = 'none';
  if (c.control_plane === 'standalone') leader = 'standalone';
  else if (c.leader != null) leader = 'node ' + c.leader + (c.is_leader ? ' (this node)' : '');
  text('leader', leader);
  $('leader').className = c.leader == null && c.control_plane !== 'standalone' ? 'bad' : '';
  text('term', c.term);
  text('version', c.decision_version);
  text('automation', label(c.automation));
  view.version = c.decision_version;
  view.zones = c.zones || {};

  const rows = (c.nodes || []).map((n) => el('tr', { 'data-node': n.id },
    el('td', {}, 'node ' + n.id + (n.leader ? ' ★' : '')),
    el('td', {}, n.zone),
    el('td', {}, label(n.role)),
    el('td', { class: n.decision_version === c.decision_version ? '' : 'warn' }, n.decision_version),
    el('td', { class: n.view_age_ms > 5000 ? 'bad' : '' }, age(n.view_age_ms)),
    el('td', { class: n.reachable ? 'ok' : 'bad' }, n.reachable ? 'yes' : 'no')));
  $('nodes').tBodies[0].replaceChildren(...rows);

  const cards = Object.entries(view.zones).map(([name, z]) => {
    const status = z.status || 'active';
    const low = typeof z.score === 'number' && z.score < CUTOFF;
    return el('div', { class: 'zone ' + status + (low ? ' low' : ''), 'data-zone': name },
      el('h3', {}, name),
      el('div', { class: 'status' }, status === 'failed_over' ? 'failed over → ' + z.target : status),
      el('div', { class: 'score' + (low ? ' bad' : '') },
        typeof z.score === 'number' ? z.score.toFixed(2) : 'no score'),
      el('div', { class: 'muted' },
        'cutoff ' + CUTOFF + (z.bad_periods ? ' · ' + z.bad_periods + ' bad periods' : '')));
  });
  $('zones').replaceChildren(...cards);
  fillSelects();
}

function fillSelects() {
  const names = Object.keys(view.zones);
  const active = names.filter((z) => (view.zones[z].status || 'active') === 'active');
  const failed = names.filter((z) => view.zones[z].status === 'failed_over');
  setOptions('fo-from', active);
  setOptions('fo-to', active);
  setOptions('fb-zone', failed);
}

function setOptions(id, values) {
  const select = $(id);
  const now = Array.from(select.options).map((o) => o.value);
  if (now.join() === values.join()) return;
  const keep = select.value;
  select.replaceChildren(...values.map((v) => el('option', { value: v }, v)));
  if (values.includes(keep)) select.value = keep;
}

function spark(points) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', '0 0 ' + (TREND_POINTS - 1) + ' 100');
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', 'score over the last two minutes');
  const line = document.createElementNS(SVG, 'polyline');
  const offset = TREND_POINTS - points.length;
  line.setAttribute('points', points.map((p, i) => (offset + i) + ',' + (100 - p)).join(' '));
  svg.append(line);
  return svg;
}

function stateClass(s) {
  return { healthy: 'ok', unknown: 'muted', degraded: 'warn', unstable: 'warn', down: 'bad' }[s] || '';
}

function renderBackends(b) {
  const rows = (b.backends || []).map((x) => {
    const trend = trends.get(x.name) || [];
    if (typeof x.score === 'number') trend.push(x.score);
    while (trend.length > TREND_POINTS) trend.shift();
    trends.set(x.name, trend);
    return el('tr', { 'data-backend': x.name },
      el('td', {}, x.name),
      el('td', {}, x.zone),
      el('td', { class: stateClass(x.health_state) }, x.health_state),
      el('td', { class: 'score' }, typeof x.score === 'number' ? x.score.toFixed(1) : '-'),
      el('td', { class: stateClass(x.health_state) }, spark(trend)),
      el('td', {}, x.in_flight),
      el('td', {}, x.latency_ewma_ms),
      el('td', {}, x.ejections));
  });
  $('backends').tBodies[0].replaceChildren(...rows);
}

function dash(v) { return v == null ? '-' : String(v); }

function rows(id, list, cells, empty) {
  const body = list.map((x) => el('tr', {}, ...cells(x).map((c) => el('td', {}, dash(c)))));
  const cols = $(id).tHead.rows[0].cells.length;
  $(id).tBodies[0].replaceChildren(...(body.length ? body : [el('tr', {}, el('td', { class: 'muted', colspan: String(cols) }, empty))]));
}

// Traffic policy: rules (configured against realised share on this node),
// shadows (agreement, latency delta, similarity) and tenants' eligibility.
function renderPolicy(r, s) {
  rows('rules', r.rules || [], (x) => [x.name, x.model, x.route_to,
    (x.match.tenants || []).join(', ') || 'any', x.percent, x.realised_percent,
    x.matched + ' / ' + x.evaluated], 'no rules');
  rows('shadows', s.shadows || [], (x) => [x.name, x.model + ' → ' + x.to, x.percent, x.sent,
    x.skipped_in_flight + x.skipped_quota + x.no_backend, x.ok + ' / ' + x.errors + ' / ' + x.timeouts,
    x.agreement, x.latency_delta_s.p50, x.similarity.p50], 'no shadows');
  rows('tenants', r.tenants || [], (x) => [x.name, x.models ? x.models.join(', ') : 'any',
    (x.require_tags || []).join(', ') || '-',
    Object.entries(x.reachable || {}).map(([m, b]) => m + ': ' + b.join(', ')).join('; ')], 'no tenants');
}

// Spend per tenant and model: this node's answers, the cluster's on the
// leader (from the nodes' reports), and shadow copies apart (no tenant's
// spend, no budget).
function renderSpend(v) {
  const money = (x) => (x == null ? '-' : x.toFixed(6) + ' ' + v.currency);
  const lines = (scope, list, who) => (list || []).flatMap((t) =>
    (t.models || []).map((m) => ({ scope: scope, who: t[who], model: m.model, spend: m.spend })));
  const all = lines('node ' + v.node, v.node_spend, 'tenant')
    .concat(v.leader ? lines('cluster', v.cluster_spend, 'tenant') : [])
    .concat(lines('shadow (apart)', v.shadow_spend, 'shadow'));
  rows('spend', all, (x) => [x.scope, x.who, x.model, money(x.spend)], 'no spend');
}

function renderDecisions(list) {
  const items = list.map((d) => el('li', {},
    'v' + d.version + ' ' + d.kind + ' ' + (d.zones || []).join(', ') + ' · ' + label(d.origin) +
    ' · ' + d.actor + ' · ' + when(d.at_ms) + ' — ' + d.reason));
  $('decisions').replaceChildren(...(items.length ? items : [el('li', { class: 'muted' }, 'none yet')]));
}

function renderEvents(list) {
  const items = list.map((e) => el('li', { class: e.kind.startsWith('ejected') || e.kind === 'breaker_opened' ? 'bad' : '' },
    when(e.at_ms) + ' ' + e.kind + ' ' + (e.backend || e.model || '') + ' ' + e.zone + ' — ' + e.reason));
  $('events').replaceChildren(...(items.length ? items : [el('li', { class: 'muted' }, 'none yet')]));
}

// Actions: a dry run first, shown for confirmation; the real write is
// guarded by the version the dry run saw (compare-and-set).
async function prepare(kind, body, describe) {
  $('action-result').textContent = '';
  try {
    const preview = await api('/admin/v1/' + kind, {
      method: 'POST',
      body: JSON.stringify(Object.assign({ dry_run: true }, body)),
    });
    const changes = ((preview.preview && preview.preview.changes) || [])
      .map((c) => c.zone + ': ' + zoneStatus(c.before) + ' → ' + zoneStatus(c.after)).join('; ');
    // Each tenant whose quota would draw on another zone.
    const overflow = (preview.quota_overflow || [])
      .map((o) => o.tenant + ' (' + o.priority + ') ' + o.from + ' → ' + o.to).join('; ');
    pending = { kind, body: Object.assign({ if_version: view.version }, body) };
    $('confirm-text').textContent = describe + '? It makes decision version ' +
      (preview.preview ? preview.preview.version : '?') + (changes ? ' (' + changes + ')' : '') + '.' +
      (overflow ? ' Quota overflow: ' + overflow + '.' : '');
    $('confirm').hidden = false;
  } catch (e) {
    if (e.message === 'unauthorized') return;
    showResult('Refused' + (e.code ? ' (' + e.code + ')' : '') + ': ' + e.message, 'bad');
  }
}

async function commit() {
  if (!pending) return;
  const { kind, body } = pending;
  pending = null;
  $('confirm').hidden = true;
  try {
    const done = await api('/admin/v1/' + kind, { method: 'POST', body: JSON.stringify(body) });
    showResult('Committed: decision version ' + done.version, 'ok');
  } catch (e) {
    if (e.message === 'unauthorized') return;
    showResult((e.code === 'outcome_unknown' ? 'Outcome unknown (check the decisions below before retrying)' : 'Refused' +
      (e.code ? ' (' + e.code + ')' : '')) + ': ' + e.message, 'bad');
  }
  refresh();
}

function showResult(message, cls) {
  const r = $('action-result');
  r.textContent = message;
  r.className = cls;
}

document.addEventListener('DOMContentLoaded', () => {
  $('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const token = $('token').value.trim();
    $('token').value = '';
    if (token) signIn(token);
  });
  $('logout').addEventListener('click', () => signOut(''));
  $('failover-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const from = $('fo-from').value, to = $('fo-to').value;
    prepare('failover', { from, to, reason: $('fo-reason').value }, 'Fail over ' + from + ' → ' + to);
  });
  $('failback-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const zone = $('fb-zone').value;
    prepare('failback', { zone, reason: $('fb-reason').value }, 'Fail back ' + zone);
  });
  $('confirm-yes').addEventListener('click', commit);
  $('confirm-no').addEventListener('click', () => {
    pending = null;
    $('confirm').hidden = true;
  });
  const token = localStorage.getItem(KEY);
  if (token) signIn(token); else showLogin('');
});
