// Fabric run inspector. Plain JavaScript, no framework, no build step.
//
// Rules of this file: every value that comes from the service (goals, prompts, model output,
// tool results, ids) reaches the page through textContent or an attribute set with
// setAttribute, never as markup; the route graph is shown as an <img> of a blob: URL. The API
// token lives in sessionStorage only and travels in the Authorization header, never in a URL.
'use strict';

(function () {
  const TOKEN_KEY = 'fabric-token';
  const STATUSES = ['queued', 'running', 'completed', 'failed', 'awaiting_input', 'cancelled'];
  const ENDED = ['completed', 'failed', 'awaiting_input', 'cancelled'];
  // What a Cancel button may still stop.
  const CANCELLABLE = ['queued', 'running', 'awaiting_input'];

  // The current page's resources: aborted when the page changes.
  let page = null;

  // ---- DOM helpers -------------------------------------------------------------------------

  function $(id) {
    return document.getElementById(id);
  }

  // el('td', {class: 'route', 'data-run-id': id}, 'text' or node, ...)
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === 'class') node.className = v;
        else if (k === 'text') node.textContent = v;
        else node.setAttribute(k, v === true ? '' : String(v));
      }
    }
    for (const c of children) append(node, c);
    return node;
  }

  function append(node, child) {
    if (child === undefined || child === null || child === false) return;
    if (Array.isArray(child)) {
      for (const c of child) append(node, c);
    } else if (child instanceof Node) {
      node.appendChild(child);
    } else {
      node.appendChild(document.createTextNode(String(child)));
    }
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function setText(node, text) {
    if (node && node.textContent !== text) node.textContent = text;
  }

  // ---- Token ---------------------------------------------------------------------------------

  function token() {
    try {
      return sessionStorage.getItem(TOKEN_KEY);
    } catch (_) {
      return null;
    }
  }

  // A bearer token travels in an HTTP header: visible ASCII only. A pasted token with a space, an
  // accent or a typographic dash in it could never be sent (the browser refuses the header).
  function tokenOk(t) {
    return typeof t === 'string' && /^[\x21-\x7e]+$/.test(t);
  }
  const TOKEN_CHARS = 'A token is made of visible ASCII characters only (no spaces, accents or typographic dashes): check what was pasted.';

  function askToken(message) {
    leavePage();
    try {
      sessionStorage.removeItem(TOKEN_KEY);
    } catch (_) {
      /* storage unavailable */
    }
    clear($('view'));
    clear($('catalogue-version'));
    $('view').hidden = true;
    $('token-form').hidden = false;
    $('token-clear').hidden = true;
    setText($('token-error'), message || '');
    $('token').value = '';
    $('token').focus();
  }

  function setupToken() {
    $('token-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const value = $('token').value.trim();
      if (!value) {
        setText($('token-error'), 'Enter the token.');
        return;
      }
      if (!tokenOk(value)) {
        setText($('token-error'), TOKEN_CHARS);
        return;
      }
      sessionStorage.setItem(TOKEN_KEY, value);
      $('token').value = '';
      setText($('token-error'), '');
      route();
    });
    $('token-clear').addEventListener('click', () => askToken(''));
  }

  // ---- API -----------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      const e = body && body.error;
      super(e && e.message ? e.message : 'HTTP ' + status);
      this.status = status;
      this.code = e && e.code;
      this.problems = (e && e.problems) || [];
    }
  }

  // The service could not be reached at all (stopped, restarting, network down).
  const UNREACHABLE = 'The service cannot be reached: it may be stopped or restarting, or the network is down';

  class NetworkError extends Error {
    constructor() {
      super(UNREACHABLE);
      this.status = 0;
      this.network = true;
      this.problems = [];
    }
  }

  function unreachable(err) {
    return !!(err && err.network);
  }

  // An error's message as the end of a sentence of ours (no doubled full stop).
  function said(err) {
    return String((err && err.message) || err).replace(/[.\s]+$/, '');
  }

  function headers(extra) {
    const h = new Headers(extra || {});
    h.set('Authorization', 'Bearer ' + token());
    return h;
  }

  async function request(path, opts) {
    opts = opts || {};
    const init = { method: opts.method || 'GET', headers: headers(opts.headers), signal: opts.signal, cache: 'no-store' };
    if (opts.json !== undefined) {
      init.headers.set('Content-Type', 'application/json');
      init.body = JSON.stringify(opts.json);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (err) {
      if (err && err.name === 'AbortError') throw err;
      throw new NetworkError();
    }
    if (res.status === 401) {
      askToken('The service refused the token; enter it again.');
      throw new ApiError(401, null);
    }
    return res;
  }

  // The ApiError of a response that is not ok, with the service's error body when it sent one.
  async function failure(res) {
    let body = null;
    try {
      body = await res.json();
    } catch (_) {
      /* not JSON */
    }
    return new ApiError(res.status, body);
  }

  async function api(path, opts) {
    const res = await request(path, opts);
    let body = null;
    const type = res.headers.get('content-type') || '';
    if (type.includes('json')) body = await res.json();
    if (!res.ok) throw new ApiError(res.status, body);
    return body;
  }

  // Server-Sent Events over fetch (EventSource cannot send the Authorization header).
  // onEvent({id, event, data}); resolves when the stream ends, rejects on an error.
  async function sse(path, opts) {
    const h = { Accept: 'text/event-stream' };
    if (opts.lastEventId) h['Last-Event-ID'] = String(opts.lastEventId);
    const res = await request(path, { headers: h, signal: opts.signal });
    if (!res.ok) throw await failure(res);
    if (opts.onOpen) opts.onOpen();
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    let ev = { id: null, event: 'message', data: [] };
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (err) {
        if (err && err.name === 'AbortError') throw err;
        throw new NetworkError();
      }
      const { value, done } = chunk;
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + (buf[nl] === '\r' && buf[nl + 1] === '\n' ? 2 : 1));
        if (line === '') {
          if (ev.data.length) opts.onEvent({ id: ev.id, event: ev.event, data: ev.data.join('\n') });
          ev = { id: ev.id, event: 'message', data: [] };
          continue;
        }
        if (line[0] === ':') continue; // a comment: the heartbeat
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? '' : line.slice(colon + 1);
        if (val[0] === ' ') val = val.slice(1);
        if (field === 'data') ev.data.push(val);
        else if (field === 'event') ev.event = val;
        else if (field === 'id') ev.id = val;
      }
    }
  }

  // ---- Formatting ----------------------------------------------------------------------------

  function ms(t) {
    const v = Date.parse(t);
    return Number.isNaN(v) ? null : v;
  }

  function fmtDuration(d) {
    if (d === null || d === undefined || Number.isNaN(d)) return '';
    if (d < 1000) return Math.round(d) + ' ms';
    if (d < 60000) return (d / 1000).toFixed(d < 10000 ? 2 : 1) + ' s';
    const m = Math.floor(d / 60000);
    return m + ' min ' + Math.round((d % 60000) / 1000) + ' s';
  }

  function fmtTime(t) {
    const v = ms(t);
    if (v === null) return t || '';
    const d = new Date(v);
    return d.toLocaleString();
  }

  function runDuration(run) {
    const a = ms(run.created_at);
    if (a === null) return null;
    const b = ENDED.includes(run.status) ? ms(run.updated_at) : Date.now();
    return b === null ? null : Math.max(0, b - a);
  }

  function reasonOf(run) {
    return run.error && run.error.reason_class ? String(run.error.reason_class) : '';
  }

  function pretty(text) {
    if (typeof text !== 'string') return JSON.stringify(text, null, 2);
    const t = text.trim();
    if (t.startsWith('{') || t.startsWith('[')) {
      try {
        return JSON.stringify(JSON.parse(t), null, 2);
      } catch (_) {
        /* as it is */
      }
    }
    return text;
  }

  function errorBox(err) {
    const box = el('div', { class: 'error' }, err.message || String(err));
    if (err.problems && err.problems.length) box.appendChild(el('pre', null, err.problems.join('\n')));
    return box;
  }

  function setConn(text) {
    setText($('conn'), text);
  }

  // ---- Catalogue versions --------------------------------------------------------------------

  // How many digits of a version are shown (the whole one is in the title), as `fabric routes list`.
  const SHORT_VERSION = 12;

  // A catalogue version as the page shows it: its first digits, the whole of it in the title.
  function versionCode(version, id) {
    return el('code', { id, title: version, 'data-version': version }, String(version).slice(0, SHORT_VERSION));
  }

  // The version new runs start on (GET /v1/catalogue), read again at every page change (a reload
  // may have changed it) and shown in the header; null until the service answered.
  let inForce = null;
  let inForceAsked = Promise.resolve(null);

  function loadInForce() {
    inForceAsked = api('/v1/catalogue')
      .then((info) => {
        inForce = info.version;
        const header = $('catalogue-version');
        clear(header);
        header.append('catalogue ', versionCode(inForce, 'catalogue-version-code'));
        return inForce;
      })
      .catch(() => inForce);
    return inForceAsked;
  }

  // ---- Pages ---------------------------------------------------------------------------------

  function leavePage() {
    if (page) {
      page.abort.abort();
      for (const f of page.cleanup) {
        try {
          f();
        } catch (_) {
          /* ignore */
        }
      }
    }
    page = null;
    setConn('');
  }

  function newPage() {
    leavePage();
    page = { abort: new AbortController(), cleanup: [] };
    const view = $('view');
    clear(view);
    return page;
  }

  function every(p, f, interval) {
    const t = setInterval(f, interval);
    p.cleanup.push(() => clearInterval(t));
  }

  function sleep(p, t) {
    return new Promise((resolve) => {
      const h = setTimeout(resolve, t);
      p.abort.signal.addEventListener('abort', () => {
        clearTimeout(h);
        resolve();
      });
    });
  }

  // Asks `ask` until the service answers (it may be restarting), saying so in `problem` in the
  // meantime and clearing it once answered. Resolves to the answer; rejects with any other error,
  // and with the last one once the page is left.
  async function whenReachable(p, problem, ask) {
    for (;;) {
      try {
        const answer = await ask();
        clear(problem);
        return answer;
      } catch (err) {
        if (p.abort.signal.aborted || !unreachable(err)) throw err;
        clear(problem);
        problem.appendChild(el('div', { class: 'error' }, said(err) + '. Retrying…'));
        await sleep(p, 2000);
        if (p.abort.signal.aborted) throw err;
      }
    }
  }

  function route() {
    const t = token();
    if (!t) {
      askToken('');
      return;
    }
    if (!tokenOk(t)) {
      askToken(TOKEN_CHARS);
      return;
    }
    $('token-form').hidden = true;
    $('view').hidden = false;
    $('token-clear').hidden = false;
    loadInForce();
    const hash = location.hash || '#/runs';
    const parts = hash.replace(/^#\/?/, '').split('/').map((s) => {
      try {
        return decodeURIComponent(s);
      } catch (_) {
        return s;
      }
    });
    for (const a of document.querySelectorAll('nav a')) a.classList.remove('current');
    if (parts[0] === 'routes') {
      $('nav-routes').classList.add('current');
      if (parts[1]) routePage(parts[1]);
      else routesPage();
    } else if (parts[0] === 'schedules') {
      $('nav-schedules').classList.add('current');
      schedulesPage();
    } else if (parts[0] === 'experiments') {
      $('nav-experiments').classList.add('current');
      if (parts[1]) experimentPage(parts[1]);
      else experimentsPage();
    } else if (parts[0] === 'runs' && parts[1]) {
      $('nav-runs').classList.add('current');
      runPage(parts[1]);
    } else {
      $('nav-runs').classList.add('current');
      if (hash !== '#/runs') history.replaceState(null, '', '#/runs');
      runsPage();
    }
  }

  // ---- Runs ----------------------------------------------------------------------------------

  function runsPage() {
    const p = newPage();
    const view = $('view');
    const routeSel = el('select', { id: 'filter-route' }, el('option', { value: '' }, 'all routes'));
    const statusSel = el('select', { id: 'filter-status' }, el('option', { value: '' }, 'all statuses'), STATUSES.map((s) => el('option', { value: s }, s)));
    const tbody = el('tbody');
    const table = el(
      'table',
      { id: 'runs' },
      el('thead', null, el('tr', null, ['run', 'route', 'status', 'started', 'duration', 'reason'].map((h) => el('th', null, h)))),
      tbody,
    );
    const note = el('p', { id: 'runs-empty', class: 'muted' }, 'Loading…');
    view.appendChild(
      el(
        'section',
        { id: 'runs-page' },
        el('h2', null, 'Runs'),
        el('div', { class: 'filters' }, el('label', null, 'Route ', routeSel), el('label', null, 'Status ', statusSel)),
        table,
        note,
      ),
    );

    // The runs seen, by id; rows are shown for those that match the filters.
    const runs = new Map();
    const rows = new Map();

    function matches(run) {
      return (!routeSel.value || run.route_id === routeSel.value) && (!statusSel.value || run.status === statusSel.value);
    }

    function fill(tr, run) {
      tr.setAttribute('data-status', run.status);
      setText(tr.querySelector('td.route'), run.route_id);
      const st = tr.querySelector('td.status');
      setText(st, run.status);
      st.className = 'status s-' + run.status;
      setText(tr.querySelector('td.started'), fmtTime(run.created_at));
      setText(tr.querySelector('td.duration'), fmtDuration(runDuration(run)));
      setText(tr.querySelector('td.reason'), reasonOf(run));
    }

    function upsert(run) {
      // The two streams read the store apart: an older picture of a run never replaces a newer.
      const known = runs.get(run.run_id);
      if (known && String(known.updated_at || '') > String(run.updated_at || '')) return;
      runs.set(run.run_id, run);
      let tr = rows.get(run.run_id);
      if (!matches(run)) {
        if (tr) {
          tr.remove();
          rows.delete(run.run_id);
        }
        updateNote();
        return;
      }
      if (!tr) {
        tr = el(
          'tr',
          { class: 'run', 'data-run-id': run.run_id },
          el('td', { class: 'id' }, el('a', { class: 'open', href: '#/runs/' + encodeURIComponent(run.run_id) }, run.run_id)),
          el('td', { class: 'route' }),
          el('td', { class: 'status' }),
          el('td', { class: 'started' }),
          el('td', { class: 'duration' }),
          el('td', { class: 'reason' }),
        );
        tr.addEventListener('click', (ev) => {
          if (ev.target.closest('a')) return;
          location.hash = '#/runs/' + encodeURIComponent(run.run_id);
        });
        // Newest first: run ids sort by start time.
        let before = null;
        for (const other of tbody.children) {
          if (other.getAttribute('data-run-id') < run.run_id) {
            before = other;
            break;
          }
        }
        tbody.insertBefore(tr, before);
        rows.set(run.run_id, tr);
      }
      fill(tr, run);
      updateNote();
    }

    let streamTrouble = false; // the note says that the live list stopped
    function updateNote() {
      if (streamTrouble) return;
      setText(note, rows.size ? '' : 'No runs' + (routeSel.value || statusSel.value ? ' match the filters.' : ' yet.'));
    }

    function refilter() {
      clear(tbody);
      rows.clear();
      const all = [...runs.values()].sort((a, b) => (a.run_id < b.run_id ? -1 : 1));
      for (const r of all) upsert(r);
      updateNote();
      const q = new URLSearchParams();
      if (routeSel.value) q.set('route', routeSel.value);
      if (statusSel.value) q.set('status', statusSel.value);
      sessionStorage.setItem('fabric-runs-filter', q.toString());
    }

    routeSel.addEventListener('change', () => {
      refilter();
      follow();
    });
    statusSel.addEventListener('change', () => {
      refilter();
      follow();
    });

    // Durations of running runs grow.
    every(
      p,
      () => {
        for (const [id, tr] of rows) {
          const run = runs.get(id);
          if (run && !ENDED.includes(run.status)) setText(tr.querySelector('td.duration'), fmtDuration(runDuration(run)));
        }
      },
      1000,
    );

    // The list, then its changes, live. The service watches the newest 200 runs of a stream's
    // filter: one stream for the route filter keeps every recent run current (a run that leaves
    // the chosen status is seen leaving), and with a status filter a second one brings that
    // status's runs from further back (an old failed run among many newer ones).
    let streams = null;
    function follow() {
      if (streams) streams.abort();
      // Start from what the new streams send: runs only an earlier status stream brought are not
      // kept (nothing would update them any more).
      runs.clear();
      rows.clear();
      clear(tbody);
      streams = new AbortController();
      const signal = streams.signal;
      p.abort.signal.addEventListener('abort', () => streams && streams.abort());
      const base = new URLSearchParams({ limit: '200' });
      if (routeSel.value) base.set('route_id', routeSel.value);
      watch(base, signal);
      if (statusSel.value) {
        const byStatus = new URLSearchParams(base);
        byStatus.set('status', statusSel.value);
        watch(byStatus, signal);
      }
    }

    function watch(q, signal) {
      (async () => {
        while (!signal.aborted) {
          try {
            await sse('/v1/runs/updates?' + q.toString(), {
              signal,
              onOpen: () => {
                setConn('live');
                streamTrouble = false;
                updateNote();
              },
              onEvent: (e) => {
                if (e.event !== 'run') return;
                try {
                  upsert(JSON.parse(e.data));
                } catch (_) {
                  /* a malformed event */
                }
              },
            });
          } catch (err) {
            if (signal.aborted || err.status === 401) return;
            streamTrouble = true;
            setText(note, 'The live list stopped: ' + said(err) + '. Retrying…');
          }
          if (signal.aborted) return;
          setConn('reconnecting');
          await sleep(p, 2000);
        }
      })();
    }

    // Filters kept for the session.
    const saved = new URLSearchParams(sessionStorage.getItem('fabric-runs-filter') || '');
    if (STATUSES.includes(saved.get('status'))) statusSel.value = saved.get('status');
    // The route filter's choices; asked again until the service answers (it may be restarting).
    (async () => {
      let first = true;
      while (!p.abort.signal.aborted) {
        let routes = null;
        try {
          routes = await api('/v1/routes', { signal: p.abort.signal });
        } catch (err) {
          if (p.abort.signal.aborted || err.status === 401) return;
        }
        let filtered = false;
        if (routes) {
          // The filter kept for the session, even when the first answers failed (the select had
          // no choices then, so nothing else can have been chosen).
          const r = routeSel.value || saved.get('route');
          for (const x of routes) routeSel.appendChild(el('option', { value: x.id }, x.id));
          if (r && routes.some((x) => x.id === r)) {
            routeSel.value = r;
            filtered = true;
          }
        }
        // The first time, or again once a route filter applies (the streams filter by route).
        if (first || filtered) {
          if (filtered && !first) refilter();
          follow();
        }
        first = false;
        if (routes) return;
        await sleep(p, 2000);
      }
    })();
  }

  // ---- Run -----------------------------------------------------------------------------------

  const SPAN_KIND = { task: 'stage', appended_synthesis: 'stage', child_run: 'child', decision: 'turn', tool: 'stage' };

  function runPage(runId) {
    const p = newPage();
    const view = $('view');
    const section = el('section', { id: 'run', 'data-run-id': runId, 'data-status': '' });
    const status = el('span', { id: 'run-status', class: 'status' }, '…');
    const meta = el('dl', { class: 'meta' });
    const goal = el('pre', { id: 'run-goal', class: 'value' });
    const output = el('pre', { id: 'run-output', class: 'value' });
    const failure = el('div', { id: 'failure', hidden: true });
    const asking = el('div', { id: 'asking', hidden: true });
    const cancelBtn = el('button', { id: 'run-cancel', type: 'button', hidden: true }, 'Cancel');
    const cancelErr = el('span', { id: 'cancel-error', class: 'error' });
    const timeline = el('ol', { id: 'timeline' });
    const stagesDiv = el('div', { id: 'stages' });
    const recordNote = el('p', { id: 'record-note', class: 'muted' });
    const problem = el('div', { id: 'run-problem' });
    const hooks = el('ul', { id: 'webhooks' });
    const catalogueDiff = el('div', { id: 'catalogue-diff', hidden: true });
    const body = [
      el('h3', null, 'Goal'),
      goal,
      el('h3', null, 'Timeline'),
      timeline,
      el('h3', null, 'Stages'),
      recordNote,
      stagesDiv,
      el('h3', null, 'Output'),
      output,
      el('h3', null, 'Webhooks'),
      hooks,
    ];
    section.append(el('h2', null, 'Run ', el('code', null, runId), ' ', status, ' ', cancelBtn, cancelErr), problem, meta, catalogueDiff, failure, asking, ...body);
    cancelBtn.addEventListener('click', async () => {
      cancelBtn.disabled = true;
      setText(cancelErr, '');
      try {
        // The run ends on whichever replica executes it, within about a second.
        const v = await api('/v1/runs/' + encodeURIComponent(runId) + '/cancel', { method: 'POST', json: { reason: 'cancelled in the run inspector' } });
        renderView(v);
        if (!ENDED.includes(v.status)) follow();
      } catch (e) {
        cancelBtn.disabled = false;
        setText(cancelErr, e.message);
      }
    });
    view.appendChild(section);

    let view_ = null; // the run as GET /v1/runs/{id} answers
    let record = null; // GET /v1/runs/{id}/record
    let lastSeq = 0;
    const spans = []; // {kind, label, start, end, depth, li, ...}
    const openStage = new Map(); // stage_id -> span in progress
    const openLlm = new Map(); // stage_id -> span in progress
    const openTool = new Map();
    const stageInfo = new Map(); // stage_id -> {role, kind, outputs: [], failed, live}
    const stageOrder = [];
    let runStart = null;
    let runEnd = null;

    function setStatus(s) {
      if (!s) return;
      section.setAttribute('data-status', s);
      setText(status, s);
      status.className = 'status s-' + s;
      cancelBtn.hidden = !CANCELLABLE.includes(s);
      if (cancelBtn.hidden) cancelBtn.disabled = false;
    }

    function stage(id) {
      let s = stageInfo.get(id);
      if (!s) {
        s = { role: null, kind: null, outputs: [], failed: null };
        stageInfo.set(id, s);
        stageOrder.push(id);
      }
      return s;
    }

    function addSpan(kind, label, start, depth, extra) {
      const li = el('li', { class: 'span k-' + kind, 'data-kind': kind });
      const name = el('span', { class: 'label' }, label);
      const track = el('span', { class: 'track' });
      const bar = el('span', { class: 'bar' });
      track.appendChild(bar);
      const dur = el('span', { class: 'duration' });
      li.append(name, track, dur);
      li.classList.add('d' + depth);
      timeline.appendChild(li);
      const span = Object.assign({ kind, label, start, end: null, depth, li, bar, dur, failed: false }, extra || {});
      spans.push(span);
      return span;
    }

    function endSpan(span, end, durationMs, failed) {
      if (!span) return;
      span.end = durationMs !== undefined && durationMs !== null && span.start !== null ? span.start + durationMs : end;
      if (failed) {
        span.failed = true;
        span.li.classList.add('failed');
        if (typeof failed === 'string') span.li.setAttribute('data-reason-class', failed);
      }
    }

    function layout() {
      if (runStart === null) return;
      const now = Date.now();
      const last = runEnd !== null ? runEnd : Math.max(now, ...spans.map((s) => s.end || 0));
      const total = Math.max(1, last - runStart);
      for (const s of spans) {
        const start = s.start === null ? runStart : s.start;
        const end = s.end !== null ? s.end : s.kind === 'retry' ? start : runEnd !== null ? runEnd : now;
        const left = ((start - runStart) / total) * 100;
        const width = Math.max(0.3, ((end - start) / total) * 100);
        s.bar.style.marginLeft = Math.min(99.7, Math.max(0, left)).toFixed(2) + '%';
        s.bar.style.width = Math.min(100 - Math.max(0, left), width).toFixed(2) + '%';
        let text = fmtDuration(end - start);
        if (s.end === null && s.kind !== 'retry') text += ' …';
        if (s.kind === 'retry' && s.delay) text = 'wait ' + fmtDuration(s.delay);
        setText(s.dur, text);
        s.li.setAttribute('data-duration-ms', String(Math.round(end - start)));
      }
    }

    function onEvent(e) {
      let ev;
      try {
        ev = JSON.parse(e.data);
      } catch (_) {
        return;
      }
      const seq = Number(e.id || ev.seq || 0);
      if (seq && seq <= lastSeq) return; // seen (a reconnect)
      if (seq) lastSeq = seq;
      const t = ms(ev.ts);
      if (runStart === null && t !== null) runStart = t;
      const sid = ev.stage_id;
      switch (ev.type || e.event) {
        case 'run.started':
        case 'run.resumed':
          setStatus('running');
          runEnd = null;
          if (ev.type === 'run.resumed') {
            // A marker, not a span: the run went on with the user's reply.
            timeline.appendChild(el('li', { class: 'marker resumed', 'data-kind': 'resumed', title: ev.reply || '' }, 'resumed with the reply: ', el('q', null, ev.reply || '')));
          }
          break;
        case 'run.stage.started': {
          const s = stage(sid);
          s.role = ev.llm_role || s.role;
          s.kind = ev.kind || s.kind;
          const kind = SPAN_KIND[ev.kind] || 'stage';
          const label =
            sid +
            (ev.llm_role && ev.llm_role !== 'none' ? ' (' + ev.llm_role + ')' : '') +
            (ev.kind === 'decision' ? ' — turn' : '') +
            (ev.kind === 'child_run' ? ' — child run' : '');
          openStage.set(sid, addSpan(kind, label, t, 0, { stageId: sid }));
          break;
        }
        case 'run.stage.completed':
          endSpan(openStage.get(sid), t, ev.duration_ms);
          openStage.delete(sid);
          stage(sid).outputs.push(ev.output);
          scheduleRecord();
          break;
        case 'run.stage.failed':
          endSpan(openStage.get(sid), t, ev.duration_ms, ev.reason_class || true);
          openStage.delete(sid);
          stage(sid).failed = { reason_class: ev.reason_class, message: ev.message };
          break;
        case 'run.llm.started':
          openLlm.set(sid, addSpan('llm', 'model ' + (ev.provider || '') + '/' + (ev.model || '') + (ev.turn ? ' turn ' + ev.turn : ''), t, 1));
          break;
        case 'run.llm.waiting': {
          // Emitted when the wait ends: the span runs back from then.
          const waited = ev.waited_ms || 0;
          const s = addSpan('wait', 'waited ' + waited + ' ms for room (' + (ev.limit || '') + ')', t !== null ? t - waited : t, 2);
          s.end = t;
          s.li.setAttribute('data-limit', ev.limit || '');
          break;
        }
        case 'run.llm.retrying': {
          const s = addSpan('retry', 'retry: attempt ' + ev.attempt + ' after ' + (ev.reason_class || ''), t, 2, { delay: ev.delay_ms });
          s.end = t !== null && ev.delay_ms ? t + ev.delay_ms : t;
          s.li.setAttribute('data-reason-class', ev.reason_class || '');
          s.li.title = ev.message || '';
          break;
        }
        case 'run.llm.delta':
        case 'run.llm.restarted':
          streamed(stage(sid), ev);
          break;
        case 'run.llm.completed': {
          if (stage(sid).live) stage(sid).live.done = true;
          const s = openLlm.get(sid);
          endSpan(s, t, ev.duration_ms);
          if (s && ev.input_tokens !== undefined) setText(s.li.querySelector('.label'), s.label + ' · ' + ev.input_tokens + '→' + ev.output_tokens + ' tokens');
          openLlm.delete(sid);
          break;
        }
        case 'run.llm.failed':
          if (stage(sid).live) stage(sid).live.done = true;
          endSpan(openLlm.get(sid), t, ev.duration_ms, ev.reason_class || true);
          openLlm.delete(sid);
          // The reply that could not be used, as received (the journal keeps only used ones).
          if (typeof ev.reply === 'string') stage(sid).failedReply = ev.reply;
          scheduleRecord();
          break;
        case 'run.tool.started':
          openTool.set(sid, addSpan('tool', 'tool ' + (ev.tool || '') + ' ' + (ev.method || '') + (ev.url ? ' ' + ev.url : ''), t, 1));
          break;
        case 'run.tool.completed': {
          const s = openTool.get(sid);
          endSpan(s, t, ev.duration_ms);
          if (s) setText(s.li.querySelector('.label'), s.label + ' → ' + ev.status + ', ' + ev.bytes + ' bytes');
          openTool.delete(sid);
          break;
        }
        case 'run.tool.failed':
          endSpan(openTool.get(sid), t, ev.duration_ms, ev.reason_class || true);
          openTool.delete(sid);
          break;
        case 'run.completed':
        case 'run.failed':
        case 'run.cancelled':
        case 'run.awaiting_input':
          runEnd = t;
          for (const m of [openStage, openLlm, openTool]) {
            for (const s of m.values()) endSpan(s, t);
            m.clear();
          }
          setStatus(ev.type.slice('run.'.length));
          break;
        default:
          break;
      }
      layout();
      renderStages();
    }

    // The text of a stage's model call as it is written (`run.llm.delta`), until the journal has
    // the reply: {turn, attempt, text, restarts, done}. `run.llm.restarted` drops the text shown:
    // the new attempt writes it again from its start. So does a first piece (index 0) of the
    // attempt shown: the stage started again on the replica that took the run over.
    function streamed(s, ev) {
      const turn = ev.turn || 0;
      const same = s.live && s.live.turn === turn;
      const restarts = (same ? s.live.restarts : 0) + (ev.type === 'run.llm.restarted' ? 1 : 0);
      const again = ev.type === 'run.llm.delta' && ev.index === 0;
      if (!same || s.live.attempt !== ev.attempt || again) s.live = { turn, attempt: ev.attempt, text: '', restarts, done: false };
      s.live.restarts = restarts;
      if (ev.type === 'run.llm.delta') s.live.text += ev.text || '';
    }

    // The streamed text of `live` as a field (as it came, never reformatted: it grows).
    function liveFields(live) {
      const title = live.done ? 'reply as received' : 'reply as received (streaming…)';
      const fields = [el('div', { class: 'field' }, el('h5', null, title), el('pre', { class: 'reply' + (live.done ? '' : ' streaming'), 'data-attempt': live.attempt }, live.text))];
      if (live.restarts) {
        fields.push(el('p', { class: 'restarted' }, 'restarted: attempt ' + live.attempt + ' writes the reply again (the text of the attempt before was dropped)'));
      }
      return fields;
    }

    let recordTimer = null;
    function scheduleRecord() {
      if (recordTimer) return;
      recordTimer = setTimeout(() => {
        recordTimer = null;
        loadRecord();
      }, 300);
    }
    p.cleanup.push(() => recordTimer && clearTimeout(recordTimer));

    async function loadRecord() {
      try {
        record = await api('/v1/runs/' + encodeURIComponent(runId) + '/record', { signal: p.abort.signal });
      } catch (err) {
        if (!p.abort.signal.aborted) setText(recordNote, 'The run record could not be read: ' + err.message);
        return;
      }
      setText(goal, pretty(record.request && record.request.goal !== undefined ? JSON.stringify(record.request.goal) : ''));
      renderStages();
      if (view_) renderView(view_);
    }

    // The run's webhook deliveries (GET /v1/runs/{id}/webhooks), read again while any is pending.
    let hooksTimer = null;
    p.cleanup.push(() => hooksTimer && clearTimeout(hooksTimer));
    async function loadWebhooks() {
      let list;
      try {
        list = (await api('/v1/runs/' + encodeURIComponent(runId) + '/webhooks', { signal: p.abort.signal })).webhooks || [];
      } catch (err) {
        if (!p.abort.signal.aborted) {
          clear(hooks);
          hooks.append(el('li', { class: 'error' }, 'The deliveries could not be read: ' + err.message));
        }
        return;
      }
      clear(hooks);
      if (list.length === 0) hooks.append(el('li', { class: 'muted' }, 'none: no webhook URL for this run, or it has not ended or asked yet'));
      for (const d of list) {
        const answer = d.last_status !== undefined ? ', last answer ' + d.last_status : '';
        const error = d.last_error ? ': ' + d.last_error : '';
        const next = d.state === 'pending' && d.next_attempt_at ? ', next attempt ' + fmtTime(d.next_attempt_at) : '';
        hooks.append(
          el(
            'li',
            { class: 'webhook', 'data-state': d.state, 'data-webhook-id': d.webhook_id },
            el('code', null, d.type),
            ' ',
            el('span', { class: 'status' }, d.state),
            ' after ' + d.attempts + ' attempt' + (d.attempts === 1 ? '' : 's') + answer + error + next + ' → ',
            el('code', null, d.url),
          ),
        );
      }
      if (list.some((d) => d.state === 'pending')) hooksTimer = setTimeout(loadWebhooks, 2000);
    }
    let hooksFor = null; // the status the deliveries were last read for

    function field(cls, title, value, missing) {
      const has = value !== undefined && value !== null;
      return el('div', { class: 'field' }, el('h5', null, title), el('pre', { class: cls + (has ? '' : ' missing') }, has ? pretty(value) : missing));
    }

    function renderStages() {
      const entries = (record && record.entries) || [];
      const calls = new Map(); // stage_id -> [model_reply]
      const results = new Map(); // stage_id -> [value]
      const notes = [];
      for (const en of entries) {
        if (en.entry === 'model_reply') {
          if (!calls.has(en.stage_id)) calls.set(en.stage_id, []);
          calls.get(en.stage_id).push(en);
          stage(en.stage_id);
        } else if (en.entry === 'stage_completed') {
          if (!results.has(en.stage_id)) results.set(en.stage_id, []);
          results.get(en.stage_id).push(en.value);
          stage(en.stage_id);
        } else if (en.entry === 'user_reply') {
          notes.push('reply: ' + en.message);
        }
      }
      clear(stagesDiv);
      for (const id of stageOrder) {
        const s = stageInfo.get(id);
        const div = el('div', { class: 'stage', 'data-stage-id': id });
        if (s.failed) div.classList.add('failed');
        div.appendChild(el('h4', null, id));
        div.appendChild(el('div', { class: 'field' }, el('h5', null, 'role'), el('span', { class: 'role' }, s.role || '(not in the events read)')));
        const cs = calls.get(id) || [];
        const pending = s.kind === 'tool' || s.kind === 'child_run' ? 'no model call in this stage' : 'not recorded: written when the stage completes' + (s.failed ? ' (this stage failed; a failed stage keeps no record)' : '');
        const failedReply = s.failedReply !== undefined ? s.failedReply : null;
        // The call being written, while the journal has no reply of its turn.
        const live = s.live && !cs.some((c, i) => (c.turn !== undefined ? c.turn : i) === s.live.turn) ? s.live : null;
        if (cs.length === 0) {
          div.append(
            field('prompt', 'resolved prompt', null, pending),
            field('user', 'user message', null, pending),
            ...(failedReply !== null
              ? [field('reply failed-reply', 'reply as received (not usable: ' + ((s.failed && s.failed.reason_class) || 'failed') + ')', failedReply)]
              : live
                ? liveFields(live)
                : [field('reply', 'reply as received', null, pending)]),
          );
        }
        cs.forEach((c, i) => {
          const box = el('div', { class: 'call', 'data-turn': c.turn });
          if (cs.length > 1) box.appendChild(el('h5', { class: 'turn' }, 'turn ' + (c.turn !== undefined ? c.turn : i)));
          box.append(field('prompt', 'resolved prompt', c.system), field('user', 'user message', c.user), field('reply', 'reply as received', c.raw));
          if (c.value !== c.raw && pretty(c.value) !== pretty(c.raw)) box.appendChild(field('value', 'value taken', c.value));
          div.appendChild(box);
        });
        if (cs.length > 0 && live && failedReply === null) {
          div.appendChild(el('div', { class: 'call', 'data-turn': live.turn }, el('h5', { class: 'turn' }, 'turn ' + live.turn), ...liveFields(live)));
        }
        if (cs.length > 0 && failedReply !== null) {
          // A decision loop's last turn failed after turns that were used.
          div.appendChild(field('failed-reply', 'last reply as received (not usable: ' + ((s.failed && s.failed.reason_class) || 'failed') + ')', failedReply));
        }
        const rs = results.get(id) || s.outputs;
        const result = rs.length ? rs[rs.length - 1] : null;
        div.appendChild(field('result', 'result', result, s.failed ? 'failed: ' + (s.failed.reason_class || '') + ' ' + (s.failed.message || '') : 'no result yet'));
        if (rs.length > 1) div.appendChild(field('results', 'every result (turns)', rs.map((r, i) => i + ': ' + r).join('\n')));
        stagesDiv.appendChild(div);
      }
      if (notes.length) stagesDiv.appendChild(el('div', { class: 'stage replies' }, el('h4', null, 'replies'), el('pre', null, notes.join('\n'))));
      setText(
        recordNote,
        record
          ? 'Prompts, user messages and replies come from the run journal, written as each stage completes; role and timings from the events.'
          : 'Loading the run record…',
      );
    }

    function renderView(v) {
      view_ = v;
      setStatus(v.status);
      clear(meta);
      const add = (k, val, id) => meta.append(el('dt', null, k), el('dd', id ? { id } : null, val));
      add('route', el('a', { href: '#/routes/' + encodeURIComponent(v.route_id) }, v.route_id), 'run-route');
      add('started', fmtTime(v.created_at));
      add('updated', fmtTime(v.updated_at));
      add('duration', fmtDuration(runDuration(v)), 'run-duration');
      add('catalogue', catalogueOf(v), 'run-catalogue');
      const req = record && record.request;
      if (req && req.session_id) add('session', el('code', null, String(req.session_id) + (req.multitask ? ' (' + String(req.multitask) + ')' : '')), 'run-session');
      if (ENDED.includes(v.status) && hooksFor !== v.status) {
        hooksFor = v.status;
        if (hooksTimer) clearTimeout(hooksTimer);
        loadWebhooks();
      }
      setText(output, v.output === undefined || v.output === null ? '' : pretty(v.output));
      // The failure.
      clear(failure);
      if ((v.status === 'failed' || v.status === 'cancelled') && v.error) {
        failure.hidden = false;
        failure.append(
          el('h3', null, v.status === 'failed' ? 'Failed' : 'Cancelled'),
          el('div', null, 'reason class: ', el('span', { class: 'reason-class' }, String(v.error.reason_class || ''))),
          // A run ended outside a stage (cancelled, its record lost) has no stage: `append(null)`
          // would show the text "null".
          v.error.stage_id ? el('div', null, 'stage: ', el('span', { class: 'stage-id' }, String(v.error.stage_id))) : '',
          el('pre', { class: 'message' }, String(v.error.message || '')),
        );
      } else {
        failure.hidden = true;
      }
      renderAsking(v);
    }

    // The run's catalogue version, and a button to what changed since when the version in force
    // is another.
    function catalogueOf(v) {
      if (!v.catalogue_version) return el('span', { class: 'muted' }, 'not recorded (a run started before versions were kept)');
      if (inForce === null) return versionCode(v.catalogue_version);
      if (v.catalogue_version === inForce) return [versionCode(v.catalogue_version), ' ', el('span', { class: 'muted' }, '(in force)')];
      const open = el('button', { id: 'catalogue-diff-open', type: 'button' }, 'diff against current');
      open.addEventListener('click', () => showDiff(v.catalogue_version, open));
      return [versionCode(v.catalogue_version), ' ', el('span', { class: 'muted' }, '(not the one in force)'), open];
    }

    // What changed from the run's version to the one in force (GET /v1/catalogue/diff), as text:
    // prompts and schemas are the catalogue's, shown with textContent like everything else.
    async function showDiff(from, open) {
      open.disabled = true;
      clear(catalogueDiff);
      catalogueDiff.hidden = false;
      catalogueDiff.append(el('p', { class: 'muted' }, 'Comparing…'));
      let d;
      try {
        d = await api('/v1/catalogue/diff?from=' + encodeURIComponent(from), { signal: p.abort.signal });
      } catch (err) {
        if (p.abort.signal.aborted || err.status === 401) return;
        open.disabled = false;
        clear(catalogueDiff);
        catalogueDiff.append(errorBox(err));
        return;
      }
      open.disabled = false;
      clear(catalogueDiff);
      catalogueDiff.append(
        el('h3', null, 'What changed from the run\'s catalogue ', versionCode(d.from), ' to the one in force ', versionCode(d.to)),
        el('pre', { id: 'catalogue-diff-text' }, d.text || 'no differences'),
      );
    }

    function renderAsking(v) {
      if (v.status !== 'awaiting_input') {
        asking.hidden = true;
        clear(asking);
        return;
      }
      if (!asking.hidden && $('reply-form')) {
        setText($('question'), v.question || '');
        return;
      }
      clear(asking);
      asking.hidden = false;
      const text = el('textarea', { id: 'reply-text', rows: 3, required: true });
      const send = el('button', { id: 'reply-send', type: 'submit' }, 'Send reply');
      const err = el('p', { id: 'reply-error', class: 'error' });
      const form = el('form', { id: 'reply-form' }, el('label', { for: 'reply-text' }, 'Your reply'), text, send, err);
      asking.append(el('h3', null, 'The run asks'), el('p', { id: 'question', class: 'question' }, v.question || ''), form);
      form.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        const message = text.value;
        if (!message.trim()) {
          setText(err, 'Write a reply first.');
          return;
        }
        send.disabled = true;
        setText(err, '');
        try {
          await api('/v1/runs/' + encodeURIComponent(runId) + '/reply', { method: 'POST', json: { message } });
        } catch (e) {
          send.disabled = false;
          setText(err, e.message);
          return;
        }
        asking.hidden = true;
        clear(asking);
        setStatus('running');
        runEnd = null;
        follow();
      });
    }

    async function refresh() {
      const v = await api('/v1/runs/' + encodeURIComponent(runId), { signal: p.abort.signal });
      renderView(v);
      return v;
    }

    let following = false;
    async function follow() {
      if (following) return;
      following = true;
      try {
        while (!p.abort.signal.aborted) {
          try {
            await sse('/v1/runs/' + encodeURIComponent(runId) + '/events', {
              signal: p.abort.signal,
              lastEventId: lastSeq || undefined,
              onOpen: () => {
                setConn('live');
                clear(problem);
              },
              onEvent,
            });
          } catch (err) {
            if (p.abort.signal.aborted || err.status === 401) return;
            setText(problem, 'The event stream stopped: ' + said(err) + '. Retrying…');
          }
          if (p.abort.signal.aborted) return;
          setConn('');
          let v;
          try {
            v = await refresh();
          } catch (err) {
            if (p.abort.signal.aborted || err.status === 401) return;
            setText(problem, said(err) + '. Retrying…');
            await sleep(p, 2000);
            continue;
          }
          clear(problem);
          await loadRecord();
          if (ENDED.includes(v.status)) return;
          // Still going (handed over to another replica, or queued): follow on.
          await sleep(p, 1000);
        }
      } finally {
        following = false;
      }
    }

    every(
      p,
      () => {
        if (runEnd === null && section.getAttribute('data-status') === 'running') layout();
        if (view_ && !ENDED.includes(view_.status)) {
          const dd = meta.querySelector('#run-duration');
          if (dd) setText(dd, fmtDuration(runDuration(view_)));
        }
      },
      500,
    );

    (async () => {
      try {
        await whenReachable(p, problem, refresh);
      } catch (err) {
        if (p.abort.signal.aborted || err.status === 401) return;
        clear(problem);
        problem.appendChild(errorBox(err));
        if (err.status === 404) {
          // Nothing to show: no empty timeline, stages or output under the message.
          section.setAttribute('data-missing', '');
          setText(status, 'not found');
          for (const n of body) n.hidden = true;
        }
        return;
      }
      // The version in force, once the service answers (asked again if it did not at first).
      (inForce === null ? loadInForce() : inForceAsked).then(() => {
        if (!p.abort.signal.aborted && view_) renderView(view_);
      });
      loadRecord();
      follow();
    })();
  }

  // ---- Routes --------------------------------------------------------------------------------

  function checksOf(r) {
    if (r.kind === 'broken') return 'broken: the catalogue has errors in it';
    return r.runs_here ? 'ok: runs here' : 'not started here (another fleet)';
  }

  // ---- Experiments (`fabric eval`, docs/evals.md) -------------------------------------------

  // A table of `heads` whose rows come from `load` (a promise of a list) through `row`.
  function listPage(id, title, heads, load, row) {
    const p = newPage();
    const tbody = el('tbody');
    const problem = el('div');
    const table = el('table', { id }, el('thead', null, el('tr', null, heads.map((h) => el('th', null, h)))), tbody);
    const note = el('p', { class: 'muted' }, 'Loading…');
    $('view').appendChild(el('section', { id: id + '-page' }, el('h2', null, title), problem, table, note));
    (async () => {
      let items;
      try {
        items = await whenReachable(p, problem, () => load(p));
      } catch (err) {
        if (p.abort.signal.aborted || err.status === 401) return;
        clear(problem);
        problem.appendChild(errorBox(err));
        return;
      }
      clear(problem);
      setText(note, items.length ? '' : 'None yet.');
      for (const item of items) tbody.appendChild(row(item));
    })();
  }

  function experimentsPage() {
    listPage('experiments', 'Experiments', ['experiment', 'name', 'dataset', 'created'], async (p) => (await api('/v1/experiments', { signal: p.abort.signal })).experiments, (e) =>
      el(
        'tr',
        { class: 'experiment', 'data-experiment-id': e.experiment_id },
        el('td', { class: 'id' }, el('a', { class: 'open', href: '#/experiments/' + encodeURIComponent(e.experiment_id) }, e.experiment_id)),
        el('td', null, e.name),
        el('td', null, e.dataset),
        el('td', null, fmtTime(e.created_at)),
      ),
    );
  }

  // An experiment's last report: failing cases first (as the report orders them), each run linked.
  function experimentPage(id) {
    listPage('experiment', 'Experiment ' + id, ['case', 'route', 'result', 'runs'], async (p) => {
      const report = await api('/v1/experiments/' + encodeURIComponent(id), { signal: p.abort.signal });
      const summary = report.name + ': ' + report.cases_passed + '/' + report.cases_total + ' cases passed (' + (report.pass_rate * 100).toFixed(1) + '%)';
      setText(document.querySelector('#experiment-page h2'), summary);
      return report.cases;
    }, (c) =>
      el(
        'tr',
        { class: 'case ' + (c.passed ? 'pass' : 'fail'), 'data-case-id': c.case_id },
        el('td', null, c.case_id),
        el('td', null, c.route_id),
        el('td', { class: c.passed ? 'status s-completed' : 'status s-failed' }, (c.passed ? 'pass ' : 'FAIL ') + Math.round(c.pass_rate * 100) + '%'),
        el(
          'td',
          null,
          c.runs.map((r) =>
            el(
              'div',
              null,
              el('a', { class: 'open', href: '#/runs/' + encodeURIComponent(r.run_id) }, 'run #' + r.repeat),
              ' ' + r.status + (r.started_from ? ', from stage ' + r.started_from : ''),
              r.verdicts.filter((v) => !v.pass).map((v) => el('div', { class: 'muted' }, v.evaluator + ': ' + v.reason)),
            ),
          ),
        ),
      ),
    );
  }

  function routesPage() {
    listPage('routes', 'Routes', ['route', 'fleet', 'kind', 'checks', 'description'], (p) => api('/v1/routes', { signal: p.abort.signal }), (r) =>
      el(
        'tr',
        { class: 'route', 'data-route-id': r.id, 'data-kind': r.kind },
        el('td', { class: 'id' }, el('a', { class: 'open', href: '#/routes/' + encodeURIComponent(r.id) }, r.id)),
        el('td', { class: 'fleet' }, r.fleet || '—'),
        el('td', { class: 'kind' }, r.kind),
        el('td', { class: 'checks' + (r.kind === 'broken' ? ' bad' : '') }, checksOf(r)),
        el('td', { class: 'description' }, r.description || ''),
      ),
    );
  }

  // ---- Schedules -----------------------------------------------------------------------------

  // Every schedule: its route, expression, zone, state, next fires, and its recent fires with
  // their runs (read again every 5 s).
  function schedulesPage() {
    const p = newPage();
    const view = $('view');
    const tbody = el('tbody');
    const table = el(
      'table',
      { id: 'schedules' },
      el('thead', null, el('tr', null, ['schedule', 'route', 'cron', 'time zone', 'state', 'next fires', 'recent fires'].map((h) => el('th', null, h)))),
      tbody,
    );
    const problem = el('div');
    const note = el('p', { id: 'schedules-empty', class: 'muted' }, 'Loading…');
    view.appendChild(el('section', { id: 'schedules-page' }, el('h2', null, 'Schedules'), problem, table, note));
    async function load() {
      let list;
      try {
        list = await whenReachable(p, problem, () => api('/v1/schedules', { signal: p.abort.signal }));
      } catch (err) {
        if (p.abort.signal.aborted || err.status === 401) return;
        clear(problem);
        problem.appendChild(errorBox(err));
        return;
      }
      const rows = [];
      for (const s of list.schedules) {
        let fires = [];
        try {
          fires = (await api('/v1/schedules/' + encodeURIComponent(s.id) + '/fires?limit=5', { signal: p.abort.signal })).fires;
        } catch (_) {
          // Deleted meanwhile: shown without its fires.
        }
        const state = s.paused ? 'paused' + (s.paused_reason ? ': ' + s.paused_reason : '') : 'active';
        const fireList = el(
          'ul',
          { class: 'fires' },
          fires.map((f) =>
            el(
              'li',
              { class: 'fire', 'data-outcome': f.outcome, title: f.why || '' },
              fmtTime(f.fire_time) + ' ' + f.outcome + ' ',
              f.run_id ? el('a', { class: 'open', href: '#/runs/' + encodeURIComponent(f.run_id), title: f.run_id }, '…' + f.run_id.slice(-8)) : '',
            ),
          ),
        );
        rows.push(
          el(
            'tr',
            { class: 'schedule', 'data-schedule-id': s.id },
            el('td', { class: 'id' }, s.id),
            el('td', { class: 'route' }, el('a', { class: 'open', href: '#/routes/' + encodeURIComponent(s.route_id) }, s.route_id)),
            el('td', { class: 'cron' }, el('code', null, s.cron)),
            el('td', { class: 'zone' }, s.timezone),
            el('td', { class: 'state' + (s.paused ? ' bad' : '') }, state),
            el('td', { class: 'next' }, s.next_fires.map(fmtTime).join(', ') || '—'),
            el('td', { class: 'recent' }, fireList),
          ),
        );
      }
      clear(problem);
      clear(tbody);
      rows.forEach((r) => tbody.appendChild(r));
      setText(note, list.schedules.length ? '' : 'No schedules. Create one with POST /v1/schedules or fabric schedules create.');
    }
    load();
    every(p, load, 5000);
  }

  function routePage(routeId) {
    const p = newPage();
    const view = $('view');
    const info = el('dl', { class: 'meta' });
    const img = el('img', { id: 'graph', alt: 'the graph of route ' + routeId });
    const graphProblem = el('div', { id: 'graph-error' });
    const goal = el('textarea', { id: 'goal', rows: 6, spellcheck: 'false' });
    goal.value = '{\n  \n}';
    const profile = el('input', { id: 'model-profile', value: 'default', spellcheck: 'false' });
    const startBtn = el('button', { id: 'start', type: 'submit' }, 'Start run');
    const goalError = el('p', { id: 'goal-error', class: 'error' });
    const form = el(
      'form',
      { id: 'start-form' },
      el('label', { for: 'goal' }, 'Goal (a JSON object)'),
      goal,
      el('label', { for: 'model-profile' }, 'Model profile'),
      profile,
      startBtn,
      goalError,
    );
    view.appendChild(
      el(
        'section',
        { id: 'route', 'data-route-id': routeId },
        el('h2', null, 'Route ', el('code', null, routeId)),
        info,
        el('h3', null, 'Graph'),
        graphProblem,
        el('div', { class: 'graph' }, img),
        el('h3', null, 'Start a run'),
        form,
      ),
    );

    api('/v1/routes', { signal: p.abort.signal })
      .then((routes) => {
        const r = routes.find((x) => x.id === routeId);
        if (!r) {
          info.appendChild(el('dd', { class: 'error' }, 'No such route in the catalogue.'));
          return;
        }
        info.append(
          el('dt', null, 'fleet'),
          el('dd', { class: 'fleet' }, r.fleet || '—'),
          el('dt', null, 'kind'),
          el('dd', { class: 'kind' }, r.kind),
          el('dt', null, 'checks'),
          el('dd', { class: 'checks' }, checksOf(r)),
          el('dt', null, 'description'),
          el('dd', { class: 'description' }, r.description || ''),
        );
      })
      .catch((err) => {
        if (!p.abort.signal.aborted && err.status !== 401) info.appendChild(el('dd', { class: 'error' }, 'The routes could not be read: ' + said(err) + '.'));
      });

    // The graph: fetched with the token, shown as an image of a blob: URL (never inline SVG).
    (async () => {
      try {
        const res = await request('/v1/routes/' + encodeURIComponent(routeId) + '/graph.svg', { signal: p.abort.signal });
        if (!res.ok) throw await failure(res);
        const blob = await res.blob();
        const url = URL.createObjectURL(new Blob([blob], { type: 'image/svg+xml' }));
        p.cleanup.push(() => URL.revokeObjectURL(url));
        img.src = url;
      } catch (err) {
        if (p.abort.signal.aborted || err.status === 401) return;
        img.hidden = true;
        graphProblem.appendChild(errorBox(err));
      }
    })();

    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      setText(goalError, '');
      let parsed;
      try {
        parsed = JSON.parse(goal.value);
      } catch (e) {
        setText(goalError, 'The goal is not valid JSON: ' + e.message);
        return;
      }
      if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
        setText(goalError, 'The goal must be a JSON object ({...}).');
        return;
      }
      startBtn.disabled = true;
      try {
        const body = { route_id: routeId, goal: parsed, model_profile: profile.value.trim() || 'default' };
        const accepted = await api('/v1/runs', { method: 'POST', json: body });
        location.hash = '#/runs/' + encodeURIComponent(accepted.run_id);
      } catch (e) {
        startBtn.disabled = false;
        setText(goalError, e.message + (e.problems && e.problems.length ? ': ' + e.problems.join('; ') : ''));
      }
    });
  }

  // ---- Start ---------------------------------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    setupToken();
    window.addEventListener('hashchange', route);
    route();
  });
})();
