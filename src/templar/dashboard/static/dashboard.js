// templar dashboard: live updates (server-sent events) and table sorting. Written for this
// project; no library. The server renders every page and chart; this file only swaps the
// <main id="live"> fragment when the server announces a new version, and sorts tables.
"use strict";

(function () {
  const main = () => document.getElementById("live");
  const state = () => document.getElementById("live-state");
  let fetching = false;
  let wanted = null;

  function sortKey(table) {
    return "templar-sort:" + location.pathname + ":" + table.id;
  }

  function cellValue(row, index, type) {
    const cell = row.cells[index];
    if (!cell) return type === "num" ? -Infinity : "";
    const raw = cell.getAttribute("data-v");
    if (type === "num") {
      const v = parseFloat(raw !== null ? raw : cell.textContent);
      return isNaN(v) ? -Infinity : v;
    }
    return (raw !== null ? raw : cell.textContent).trim().toLowerCase();
  }

  function sortTable(table, index, dir) {
    const th = table.tHead.rows[0].cells[index];
    if (!th) return;
    const type = th.getAttribute("data-type") || "text";
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    rows.sort(function (a, b) {
      const x = cellValue(a, index, type);
      const y = cellValue(b, index, type);
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.from(table.tHead.rows[0].cells).forEach(function (c) {
      c.removeAttribute("aria-sort");
    });
    th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
  }

  function applySorts() {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      let saved = null;
      try { saved = JSON.parse(sessionStorage.getItem(sortKey(table)) || "null"); } catch (e) { saved = null; }
      if (saved) sortTable(table, saved.index, saved.dir);
    });
  }

  document.addEventListener("click", function (ev) {
    const th = ev.target.closest("table.sortable th.sort");
    if (!th) return;
    const table = th.closest("table");
    const index = th.cellIndex;
    const current = th.getAttribute("aria-sort");
    // numbers sort largest first on the first click, text A to Z
    const first = th.getAttribute("data-type") === "num" ? -1 : 1;
    const dir = current === "ascending" ? -1 : current === "descending" ? 1 : first;
    sortTable(table, index, dir);
    try { sessionStorage.setItem(sortKey(table), JSON.stringify({ index: index, dir: dir })); } catch (e) { /* private mode */ }
  });

  function setState(text, cls) {
    const el = state();
    if (!el) return;
    el.textContent = text;
    el.className = "live " + (cls || "");
  }

  function refresh(version) {
    const m = main();
    if (!m || String(version) === m.getAttribute("data-version")) return;
    if (fetching) { wanted = version; return; }
    fetching = true;
    fetch(location.pathname + location.search, { headers: { "X-Fragment": "1" }, cache: "no-store" })
      .then(function (r) {
        if (!r.ok && r.status !== 404) throw new Error("HTTP " + r.status);
        const v = r.headers.get("x-version");
        return r.text().then(function (html) { return [html, v]; });
      })
      .then(function (res) {
        const open = Array.from(m.querySelectorAll("details")).map(function (d) { return d.open; });
        m.innerHTML = res[0];
        m.setAttribute("data-version", res[1] || String(version));
        m.querySelectorAll("details").forEach(function (d, i) { if (i < open.length) d.open = open[i]; });
        applySorts();
        setState("auto-update · updated " + new Date().toLocaleTimeString(), "on");
      })
      .catch(function () { setState("update failed; retrying", "off"); })
      .finally(function () {
        fetching = false;
        if (wanted !== null) { const w = wanted; wanted = null; refresh(w); }
      });
  }

  function connect() {
    if (!window.EventSource) {  // very old browsers: poll instead
      setState("auto-update (polling)", "on");
      setInterval(function () { refresh("poll-" + Date.now()); }, 5000);
      return;
    }
    const es = new EventSource("/events");
    es.addEventListener("open", function () { setState("auto-update on", "on"); });
    es.addEventListener("version", function (ev) { refresh(ev.data); });
    es.addEventListener("error", function () { setState("reconnecting…", "off"); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    applySorts();
    connect();
  });
})();
