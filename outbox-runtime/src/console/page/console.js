"use strict";
// The outbox console page. Every value read from the API is put into the page as text
// (textContent or an attribute), never parsed as markup.
(function () {
  const TOKEN_KEY = "outbox-console-token";
  const DATABASE_KEY = "outbox-console-database";
  // The API lives beside the page, wherever the service mounted the console.
  const base = window.location.pathname.replace(/\/?$/, "/");
  const $ = (id) => document.getElementById(id);
  // Over a set of databases, `databases` lists them and `database` is the one every view shows.
  const state = { token: sessionStorage.getItem(TOKEN_KEY), view: "overview", page: 1, limit: 25, filter: {}, selected: null, timer: null, databases: [], database: sessionStorage.getItem(DATABASE_KEY) };

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }

  function say(text, error) {
    const m = $("message");
    m.textContent = text || "";
    m.className = error ? "error" : "";
  }

  class Unauthorized extends Error {}

  async function api(path, options) {
    const init = { method: (options && options.method) || "GET", headers: { Authorization: "Bearer " + state.token } };
    if (options && options.body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    // Every route but the list of databases works on the database selected.
    if (state.database && path !== "databases") {
      path += (path.includes("?") ? "&" : "?") + "database=" + encodeURIComponent(state.database);
    }
    const response = await fetch(base + "api/" + path, init);
    const body = await response.json().catch(() => ({}));
    if (response.status === 401) throw new Unauthorized(body.error || "authentication required");
    if (!response.ok) throw new Error(body.error || response.status + " " + response.statusText);
    return body;
  }

  function age(secs) {
    if (secs === null || secs === undefined) return "–";
    if (secs < 1) return Math.round(secs * 1000) + " ms";
    if (secs < 120) return secs.toFixed(secs < 10 ? 1 : 0) + " s";
    if (secs < 7200) return Math.round(secs / 60) + " min";
    if (secs < 172800) return (secs / 3600).toFixed(1) + " h";
    return (secs / 86400).toFixed(1) + " d";
  }

  function when(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toLocaleString();
  }

  // The first line of a text, cut to `max` characters: lists stay one line a row whatever an
  // error holds; the detail shows it whole.
  function firstLine(text, max) {
    const all = String(text || "").trimStart();
    const first = all.split(/\r?\n|\r/, 1)[0].trimEnd();
    const limit = max || 160;
    if (first.length <= limit && first.length === all.trimEnd().length) return first;
    return first.slice(0, limit - 1) + "…";
  }

  // A cell is text; `box` puts the text in a block of that class instead (`clip`: one line cut
  // at the column's width, `long`: a scrolling box).
  function row(cells, attrs) {
    const tr = el("tr", null, attrs);
    for (const c of cells) {
      const td = el("td", c.box ? null : c.text, c.attrs);
      if (c.box) td.appendChild(el("div", c.text, { class: c.box }));
      if (c.className) td.className = c.className;
      tr.appendChild(td);
    }
    return tr;
  }

  function fill(tableId, rows, empty) {
    const body = $(tableId).querySelector("tbody");
    body.replaceChildren();
    if (rows.length === 0) {
      const cols = $(tableId).querySelectorAll("th").length;
      body.appendChild(row([{ text: empty, attrs: { colspan: String(cols) } }]));
    }
    for (const r of rows) body.appendChild(r);
  }

  // ---- login -------------------------------------------------------------------------------
  function show(view) {
    state.view = view;
    for (const id of ["login", "overview", "dead", "groups", "audit"]) $(id).hidden = id !== view;
    $("nav").hidden = view === "login";
    for (const b of document.querySelectorAll("nav button[data-view]")) {
      if (b.dataset.view === view) b.setAttribute("aria-current", "page");
      else b.removeAttribute("aria-current");
    }
    clearInterval(state.timer);
    if (view === "overview") {
      refreshOverview();
      state.timer = setInterval(refreshOverview, 15000);
    } else if (view === "dead") refreshDead();
    else if (view === "groups") refreshGroups();
    else if (view === "audit") refreshAudit();
  }

  function logout(text) {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    $("database-picker").hidden = true;
    show("login");
    say(text || "", Boolean(text));
  }

  async function guarded(work) {
    try {
      await work();
    } catch (e) {
      if (e instanceof Unauthorized) logout("The token was refused: " + e.message);
      else say(e.message, true);
    }
  }

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = $("token").value.trim();
    $("token").value = "";
    guarded(async () => {
      const databases = await api("databases");
      sessionStorage.setItem(TOKEN_KEY, state.token);
      showDatabases(databases);
      say("");
      show("overview");
    });
  });
  $("logout").addEventListener("click", () => logout(""));
  for (const b of document.querySelectorAll("nav button[data-view]")) {
    b.addEventListener("click", () => { say(""); show(b.dataset.view); });
  }

  // ---- the set of databases ---------------------------------------------------------------
  // A console over a set lists its databases (none over one database): the selector picks the
  // one every view shows, the overview's first table shows them all, those nobody owns or that
  // cannot be read marked.
  function owner(o) {
    if (o.state === "owned") return o.instance;
    if (o.state === "unowned") return "UNOWNED";
    if (o.state === "unknown") return "unknown";
    return "–";
  }

  function trouble(d) {
    if (d.error) return "unreadable";
    if (d.owner.state === "unowned") return "unowned";
    if (d.owner.state === "unknown") return "owner unknown";
    return "";
  }

  function showDatabases(list) {
    state.databases = list;
    const isSet = list.length > 0;
    $("database-picker").hidden = !isSet;
    $("set").hidden = !isSet;
    if (!isSet) {
      state.database = null;
      return;
    }
    if (!list.some((d) => d.database === state.database)) state.database = list[0].database;
    sessionStorage.setItem(DATABASE_KEY, state.database);
    $("database").replaceChildren(...list.map((d) => el("option",
      d.needs_attention ? d.database + " (" + trouble(d) + ")" : d.database,
      { value: d.database, "data-attention": String(d.needs_attention) })));
    $("database").value = state.database;
    $("showing").textContent = "Database " + state.database;
    fill("databases", list.map((d) => {
      const tr = row([
        { text: d.database },
        { text: owner(d.owner), className: "owner" + (d.owner.state === "owned" ? "" : " bad"), attrs: { title: d.owner.error || "" } },
        { text: d.pending === null ? "?" : d.pending, className: "num" },
        { text: d.error ? "?" : age(d.oldest_pending_age_secs), className: "num" },
        { text: d.dead === null ? "?" : d.dead, className: "num" + (d.dead > 0 ? " bad" : "") },
        { text: d.inbox_backlog === null ? "?" : d.inbox_backlog, className: "num" },
        { text: d.error ? firstLine(d.error) : trouble(d), box: "clip", attrs: { title: d.error || "" } },
      ], {
        class: "clickable" + (d.needs_attention ? " attention" : "") + (d.database === state.database ? " selected" : ""),
        "data-database": d.database, "data-attention": String(d.needs_attention), tabindex: "0",
      });
      tr.addEventListener("click", () => choose(d.database));
      tr.addEventListener("keydown", (e) => { if (e.key === "Enter") choose(d.database); });
      return tr;
    }), "no database");
  }

  // Every view shows `name` from now on.
  function choose(name) {
    if (name === state.database) return;
    state.database = name;
    sessionStorage.setItem(DATABASE_KEY, name);
    $("database").value = name;
    $("showing").textContent = "Database " + name;
    for (const tr of $("databases").querySelectorAll("tbody tr")) tr.classList.toggle("selected", tr.dataset.database === name);
    state.filter = {};
    state.page = 1;
    state.selected = null;
    $("filters").reset();
    $("replay-matching").disabled = true;
    $("ignore-matching").disabled = true;
    $("detail").hidden = true;
    say("");
    show(state.view);
  }

  $("database").addEventListener("change", () => choose($("database").value));

  // ---- overview ----------------------------------------------------------------------------
  function refreshOverview() {
    return guarded(async () => {
      if (state.databases.length > 0) showDatabases(await api("databases"));
      const [status, samples] = await Promise.all([api("status"), api("samples")]);
      const o = status.outbox;
      const deadTotal = o.dead + status.consumers.reduce((n, c) => n + c.dead, 0);
      const stuckTotal = o.stuck + status.consumers.reduce((n, c) => n + c.stuck, 0);
      $("c-backlog").textContent = o.backlog;
      $("c-oldest").textContent = age(o.oldest_unsent_age_secs);
      $("c-dead").textContent = deadTotal;
      $("c-dead").className = "value" + (deadTotal > 0 ? " bad" : "");
      $("c-stuck").textContent = stuckTotal;
      $("c-stuck").className = "value" + (stuckTotal > 0 ? " bad" : "");
      $("c-scheduled").textContent = o.scheduled;
      $("c-next-due").textContent = o.next_due_at ? "next " + when(o.next_due_at) : "";
      fill("outbox-counts", Object.entries(o.counts).map(([s, n]) =>
        row([{ text: s }, { text: n, className: "num" }], { "data-status": s })), "no events");
      const paused = status.paused || [];
      const pausedConsumers = new Set(paused.filter((p) => p.kind === "consumer").map((p) => p.name));
      fill("consumers", status.consumers.map((c) => {
        const isPaused = pausedConsumers.has(c.consumer);
        const tr = row([
          { text: c.consumer },
          { text: c.backlog, className: "num" },
          { text: age(c.lag_secs), className: "num" },
          { text: c.dead, className: "num" + (c.dead > 0 ? " bad" : "") },
          { text: c.stuck, className: "num" },
          { text: c.counts.DONE || 0, className: "num" },
        ], { "data-consumer": c.consumer, "data-paused": String(isPaused) });
        const state = el("td", null, { class: "state" });
        state.appendChild(el("span", isPaused ? "paused" : "running", { class: isPaused ? "bad" : "good", "data-testid": "consumer-state" }));
        const button = el("button", isPaused ? "Resume" : "Pause", { type: "button", "data-testid": "consumer-pause" });
        button.addEventListener("click", () => pauseOrResume(isPaused ? "resume" : "pause", "consumer", c.consumer));
        state.appendChild(button);
        tr.appendChild(state);
        return tr;
      }), "no consumer has received anything yet");
      showPauses(paused);
      fill("relays", status.relays.filter((r) => r.current).map((r) => row([
        { text: r.relay_id },
        { text: r.transport },
        { text: r.broker_available ? "available" : "unavailable for " + age(r.unavailable_secs), className: r.broker_available ? "good" : "bad" },
        { text: r.held_back, className: "num" },
        { text: firstLine(r.last_error), box: "clip" },
      ])), "no relay running");
      showStorage(status.storage);
      drawCharts(samples.samples);
    });
  }

  // Every pause in force, each with its Resume button.
  function showPauses(paused) {
    fill("pauses", paused.map((p) => {
      const tr = row([
        { text: p.kind }, { text: p.name }, { text: when(p.since) }, { text: p.by || "" },
        { text: firstLine(p.reason), box: "clip", attrs: { title: p.reason || "" } },
      ], { "data-pause": p.kind + " " + p.name });
      const actions = el("td");
      const resume = el("button", "Resume", { type: "button", "data-testid": "pause-resume" });
      resume.addEventListener("click", () => pauseOrResume("resume", p.kind, p.name));
      actions.appendChild(resume);
      tr.appendChild(actions);
      return tr;
    }), "nothing is paused");
  }

  // Pause or resume a consumer or a destination, with an optional reason, then show the
  // overview again.
  async function pauseOrResume(verb, kind, name) {
    const question = (verb === "pause" ? "Pause " : "Resume ") + kind + " " + name + "?";
    const reason = await askReason(question, true);
    if (reason === null) return;
    await guarded(async () => {
      const body = { kind, name };
      if (reason) body.reason = reason;
      const report = await api(verb, { method: "POST", body });
      const what = report.kind + " " + report.name;
      if (report.changed) say((verb === "pause" ? "Paused " : "Resumed ") + what + ".");
      else say(what + (verb === "pause" ? " was paused already." : " was not paused."));
      if (verb === "pause" && kind === "destination") $("pause-destination").reset();
      await refreshOverview();
    });
  }

  $("pause-destination").addEventListener("submit", (event) => {
    event.preventDefault();
    const name = String(new FormData($("pause-destination")).get("name") || "").trim();
    if (name) pauseOrResume("pause", "destination", name);
  });

  // The queue tables as the server counts them, and what holds vacuum back (`outbox doctor`
  // says what to do about either).
  function showStorage(storage) {
    const tables = (storage && storage.tables) || [];
    fill("storage", tables.map((t) => {
      const crowded = t.dead_rows !== null && t.dead_rows >= 10000 && t.dead_ratio >= 0.2;
      return row([
        { text: t.table },
        { text: t.live_rows === null ? "–" : t.live_rows, className: "num" },
        {
          text: t.dead_rows === null ? "–" : t.dead_rows + " (" + Math.round(t.dead_ratio * 100) + "%)",
          className: "num" + (crowded ? " bad" : ""),
        },
        { text: size(t.bytes), className: "num" },
        t.autovacuum_enabled
          ? { text: t.vacuumed_secs_ago === null ? "never" : age(t.vacuumed_secs_ago) + " ago" }
          : { text: "autovacuum off", className: "bad" },
      ], { "data-table": t.table });
    }), "the database keeps no table statistics (SQLite)");
    const notes = [];
    if (storage && storage.autovacuum === false) notes.push("Autovacuum is off on this server.");
    const h = storage && storage.oldest_holder;
    if (h) {
      let who = h.kind + (h.pid !== null ? " " + h.pid : "") + (h.name ? " (" + h.name + ")" : "");
      if (h.age_secs !== null) who += " for " + age(h.age_secs);
      if (h.state) who += ", " + h.state;
      notes.push("Oldest snapshot held: " + who + ".");
    }
    $("horizon").textContent = notes.join(" ");
  }

  function size(bytes) {
    if (bytes === null || bytes === undefined) return "–";
    if (bytes >= 1 << 30) return (bytes / (1 << 30)).toFixed(1) + " GiB";
    if (bytes >= 1 << 20) return (bytes / (1 << 20)).toFixed(1) + " MiB";
    return Math.round(bytes / 1024) + " KiB";
  }

  const COLORS = ["#0b5cad", "#b42318", "#1a7f37", "#8250df", "#bf8700", "#0a7480", "#cf222e", "#57606a"];

  function chart(figureId, series, unit) {
    const figure = $(figureId);
    figure.replaceChildren();
    const points = series.flatMap((s) => s.points);
    if (new Set(points.map((p) => p[0])).size < 2) {
      figure.appendChild(el("p", "The chart fills in as samples are taken.", { class: "legend" }));
      return;
    }
    const NS = "http://www.w3.org/2000/svg";
    const W = 600, H = 180, L = 48, B = 20, T = 8, R = 8;
    const t0 = Math.min(...points.map((p) => p[0])), t1 = Math.max(...points.map((p) => p[0]));
    const vmax = Math.max(1, ...points.map((p) => p[1]));
    const x = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - R);
    const y = (v) => T + (1 - v / vmax) * (H - T - B);
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("role", "img");
    const text = (tx, ty, value, anchor) => {
      const t = document.createElementNS(NS, "text");
      t.setAttribute("x", tx); t.setAttribute("y", ty);
      t.setAttribute("font-size", "10"); t.setAttribute("fill", "#5b6470");
      if (anchor) t.setAttribute("text-anchor", anchor);
      t.textContent = value;
      svg.appendChild(t);
    };
    const axis = document.createElementNS(NS, "path");
    axis.setAttribute("d", "M" + L + " " + T + " V" + (H - B) + " H" + (W - R));
    axis.setAttribute("stroke", "#d7dce2"); axis.setAttribute("fill", "none");
    svg.appendChild(axis);
    text(L - 4, T + 8, unit === "s" ? age(vmax) : String(vmax), "end");
    text(L - 4, H - B, "0", "end");
    text(L, H - 4, new Date(t0).toLocaleTimeString());
    text(W - R, H - 4, new Date(t1).toLocaleTimeString(), "end");
    const legend = el("div", null, { class: "legend" });
    series.forEach((s, i) => {
      if (s.points.length === 0) return;
      const line = document.createElementNS(NS, "polyline");
      line.setAttribute("points", s.points.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", COLORS[i % COLORS.length]);
      line.setAttribute("stroke-width", "2");
      line.setAttribute("vector-effect", "non-scaling-stroke");
      svg.appendChild(line);
      const item = el("span", null);
      const swatch = el("span", null, { class: "swatch" });
      swatch.style.background = COLORS[i % COLORS.length];
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(s.name));
      legend.appendChild(item);
    });
    figure.appendChild(svg);
    figure.appendChild(legend);
  }

  function drawCharts(samples) {
    const at = (s) => new Date(s.at).getTime();
    const consumers = [...new Set(samples.flatMap((s) => Object.keys(s.consumers)))];
    chart("chart-backlog", [
      { name: "outbox", points: samples.map((s) => [at(s), s.outbox_backlog]) },
      ...consumers.map((c) => ({ name: c, points: samples.filter((s) => s.consumers[c]).map((s) => [at(s), s.consumers[c].backlog]) })),
    ], "events");
    chart("chart-lag", [
      { name: "outbox (oldest unsent)", points: samples.map((s) => [at(s), s.outbox_oldest_unsent_secs || 0]) },
      ...consumers.map((c) => ({ name: c, points: samples.filter((s) => s.consumers[c]).map((s) => [at(s), s.consumers[c].lag_secs || 0]) })),
    ], "s");
  }

  // ---- dead letters ------------------------------------------------------------------------
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData($("filters"));
    state.filter = {};
    for (const [k, v] of data.entries()) if (String(v).trim()) state.filter[k] = String(v).trim();
    state.page = 1;
    const filtered = Object.keys(state.filter).length > 0;
    $("replay-matching").disabled = !filtered;
    $("ignore-matching").disabled = !filtered || state.filter.source === "outbox";
    refreshDead();
  });
  $("prev").addEventListener("click", () => { if (state.page > 1) { state.page -= 1; refreshDead(); } });
  $("next").addEventListener("click", () => { state.page += 1; refreshDead(); });

  function refreshDead() {
    return guarded(async () => {
      const query = new URLSearchParams({ ...state.filter, page: String(state.page), limit: String(state.limit) });
      const list = await api("dead-letters?" + query.toString());
      $("page-no").textContent = "page " + list.page;
      $("prev").disabled = list.page <= 1;
      $("next").disabled = list.items.length < list.limit;
      fill("dead-list", list.items.map((d) => {
        const tr = row([
          { text: d.id },
          { text: d.consumer || "" },
          { text: d.event_type || "" },
          { text: [d.aggregate_type, d.aggregate_id].filter(Boolean).join(" ") },
          { text: d.attempts, className: "num" },
          { text: firstLine(d.last_error), box: "clip" },
          { text: when(d.arrived_at) },
        ], { class: "clickable", "data-id": d.id, tabindex: "0" });
        tr.addEventListener("click", () => openDetail(d.id));
        tr.addEventListener("keydown", (e) => { if (e.key === "Enter") openDetail(d.id); });
        return tr;
      }), "no dead letters");
      if (state.selected && !list.items.some((d) => d.id === state.selected)) $("detail").hidden = true;
    });
  }

  function openDetail(id) {
    return guarded(async () => {
      const d = await api("dead-letters/" + encodeURIComponent(id));
      state.selected = id;
      for (const tr of $("dead-list").querySelectorAll("tbody tr")) tr.classList.toggle("selected", tr.dataset.id === id);
      $("detail-title").textContent = d.id + " · " + d.status;
      const dl = $("detail-fields");
      dl.replaceChildren();
      const fields = [
        ["Status", d.status], ["Consumer", d.consumer], ["Message id", d.message_id], ["Event type", d.event_type],
        ["Aggregate", [d.aggregate_type, d.aggregate_id].filter(Boolean).join(" ")], ["Attempts", d.attempts],
        ["Last error", d.last_error], ["Arrived", when(d.arrived_at)], ["Next attempt", d.next_attempt_at && when(d.next_attempt_at)],
        ["Source", d.source], ["Schema version", d.schema_version], ["Envelope error", d.envelope_error],
      ];
      for (const [k, v] of fields) {
        if (v === null || v === undefined || v === "") continue;
        dl.appendChild(el("dt", k));
        // An error is shown whole, in a box that scrolls when it is long.
        const dd = el("dd", k === "Last error" ? null : v);
        if (k === "Last error") dd.appendChild(el("div", v, { class: "long", "data-testid": "last-error" }));
        dl.appendChild(dd);
      }
      let payload = d.payload;
      try { payload = JSON.stringify(JSON.parse(d.payload), null, 2); } catch (_) { /* shown as received */ }
      fill("failures", (d.failures || []).slice().reverse().map((f) => row([
        { text: when(f.at) }, { text: f.attempt, className: "num" },
        { text: f.status, className: f.status === "DEAD" ? "bad" : "" }, { text: f.error, box: "long" },
      ])), "no failed attempt recorded");
      $("detail-payload").textContent = payload;
      $("detail-envelope").textContent = d.envelope ? JSON.stringify(d.envelope, null, 2) : "–";
      $("detail-headers").textContent = d.headers ? JSON.stringify(d.headers, null, 2) : "–";
      const dead = d.status === "DEAD";
      $("do-replay").disabled = !dead;
      $("do-ignore").disabled = !dead;
      $("do-ignore").hidden = !id.startsWith("inbox:");
      $("detail").hidden = false;
    });
  }

  // Asks for the reason of an action: resolves to it, or to null when cancelled. An `optional`
  // reason may be left empty ("").
  function askReason(title, optional) {
    return new Promise((resolve) => {
      const dialog = $("reason-dialog");
      $("reason-title").textContent = title;
      $("reason-label").textContent = optional ? "Reason (optional, recorded in the audit log)" : "Reason (recorded in the audit log)";
      $("reason").required = !optional;
      $("reason").value = "";
      const done = (value) => {
        $("reason-form").removeEventListener("submit", onSubmit);
        $("reason-cancel").removeEventListener("click", onCancel);
        dialog.close();
        resolve(value);
      };
      const onSubmit = (event) => {
        event.preventDefault();
        const reason = $("reason").value.trim();
        if (reason || optional) done(reason);
      };
      const onCancel = () => done(null);
      $("reason-form").addEventListener("submit", onSubmit);
      $("reason-cancel").addEventListener("click", onCancel);
      dialog.showModal();
    });
  }

  function describe(report, verb) {
    const changed = report.outbox + report.inbox;
    let text = verb + " " + changed + " row" + (changed === 1 ? "" : "s") + ".";
    for (const s of report.skipped) {
      text += " " + s.target + (s.status ? " is " + s.status + ", not " + s.expected + ": left unchanged." : " not found.");
    }
    return text;
  }

  async function act(path, question, done, body) {
    const reason = await askReason(question);
    if (!reason) return;
    await guarded(async () => {
      const report = await api(path, { method: "POST", body: { ...body, reason } });
      say(describe(report, done));
      $("detail").hidden = true;
      state.selected = null;
      await (state.view === "groups" ? refreshGroups() : refreshDead());
    });
  }

  function filterText() {
    return Object.entries(state.filter).map(([k, v]) => k.replace("_", " ") + " = " + v).join(", ");
  }

  $("do-replay").addEventListener("click", () =>
    act("replay", "Replay " + state.selected + "?", "Replayed", { ids: [state.selected] }));
  $("do-ignore").addEventListener("click", () =>
    act("ignore", "Ignore " + state.selected + "?", "Ignored", { ids: [state.selected] }));
  $("replay-matching").addEventListener("click", () =>
    act("replay", "Replay every dead letter where " + filterText() + "?", "Replayed", { filter: state.filter }));
  $("ignore-matching").addEventListener("click", () =>
    act("ignore", "Ignore every dead inbox message where " + filterText() + "?", "Ignored", { filter: state.filter }));

  // ---- failure groups ----------------------------------------------------------------------
  function refreshGroups() {
    return guarded(async () => {
      const groups = await api("failure-groups");
      fill("group-list", groups.map((g) => {
        const actions = el("td");
        const replay = el("button", "Replay", { type: "button", "data-testid": "group-replay" });
        replay.addEventListener("click", () =>
          act("replay", "Replay the " + g.count + " dead letters of group " + g.fingerprint + "?", "Replayed", { group: g.fingerprint }));
        actions.appendChild(replay);
        if (g.source === "inbox") {
          const ignore = el("button", "Ignore", { type: "button", "data-testid": "group-ignore" });
          ignore.addEventListener("click", () =>
            act("ignore", "Ignore the " + g.count + " dead messages of group " + g.fingerprint + "?", "Ignored", { group: g.fingerprint }));
          actions.appendChild(ignore);
        }
        const tr = row([
          { text: g.count, className: "num" }, { text: g.source },
          { text: firstLine(g.pattern), box: "clip", attrs: { title: g.example } },
          { text: g.consumers.join(", ") }, { text: g.event_types.join(", ") },
          { text: when(g.first_seen) }, { text: when(g.last_seen) }, { text: g.fingerprint },
        ], { "data-group": g.fingerprint });
        tr.prepend(actions);
        return tr;
      }), "no dead letters");
    });
  }

  // ---- audit -------------------------------------------------------------------------------
  function refreshAudit() {
    return guarded(async () => {
      const actions = await api("audit?limit=200");
      fill("audit-list", actions.map((a) => row([
        { text: when(a.at) }, { text: a.action }, { text: a.target },
        { text: a.rows_affected, className: "num" }, { text: a.actor || "" }, { text: a.reason || "" },
      ], { "data-action": a.action })), "no action recorded yet");
    });
  }

  if (state.token) {
    guarded(async () => {
      showDatabases(await api("databases"));
      show("overview");
    });
  } else show("login");
})();
