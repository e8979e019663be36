// The memory snapshot viewer: draws the snapshot embedded in the page (see viewer.rs).
"use strict";
(function () {
  const errors = [];
  window.addEventListener("error", (e) => {
    errors.push(String(e.message));
    document.body.dataset.errors = errors.join("; ");
  });
  const snapshot = JSON.parse(document.getElementById("snapshot").textContent);
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];
  const SVG = "http://www.w3.org/2000/svg";

  function human(bytes) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = bytes, unit = 0;
    while (value >= 1024 && unit + 1 < units.length) { value /= 1024; unit++; }
    return unit === 0 ? bytes + " B" : value.toFixed(2) + " " + units[unit];
  }
  const hex = (n) => "0x" + Number(n).toString(16);
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // The history's allocations: an allocate event opens one (by resource, address and size), a
  // free_requested event closes the latest open one of the same (buffers may alias: a grown
  // virtual buffer and its growth share an address); those still open end at the last event.
  const moves = snapshot.events.filter((e) => e.kind === "allocate" || e.kind === "free_requested");
  const open = new Map();
  const allocations = [];
  moves.forEach((e, i) => {
    const key = e.resource + ":" + e.address + ":" + e.size;
    if (e.kind === "allocate") {
      const a = { start: i, end: moves.length, size: e.size, event: e, index: allocations.length };
      allocations.push(a);
      if (!open.has(key)) open.set(key, []);
      open.get(key).push(a);
    } else if (open.has(key)) {
      const list = open.get(key);
      list.pop().end = i;
      if (!list.length) open.delete(key);
    }
  });
  // The largest are drawn one by one, the rest as one band on top.
  const bySize = allocations.slice().sort((a, b) => b.size - a.size);
  const drawn = new Set(bySize.slice(0, DRAWN_ALLOCATIONS));
  const n = Math.max(moves.length, 1);

  // Sweep the moves: the drawn live allocations stay stacked in the order they were made; each
  // band is its offsets at the moments they change.
  const stack = [];
  const bands = new Map();
  const rest = [];  // [x, drawn total, rest total]
  let restBytes = 0, drawnBytes = 0;
  const starts = new Map(), ends = new Map();
  for (const a of allocations) {
    if (!starts.has(a.start)) starts.set(a.start, []);
    starts.get(a.start).push(a);
    if (!ends.has(a.end)) ends.set(a.end, []);
    ends.get(a.end).push(a);
  }
  function restack(x) {
    let offset = 0;
    for (const a of stack) {
      const band = bands.get(a);
      const last = band[band.length - 1];
      if (!last || last[1] !== offset) band.push([x, offset]);
      offset += a.size;
    }
  }
  for (let x = 0; x <= moves.length; x++) {
    let changed = false;
    for (const a of ends.get(x) || []) {
      if (drawn.has(a)) {
        const band = bands.get(a);
        band.push([x, band[band.length - 1][1]]);
        band.closed = true;
        stack.splice(stack.indexOf(a), 1);
        drawnBytes -= a.size;
        changed = true;
      } else {
        restBytes -= a.size;
      }
    }
    for (const a of starts.get(x) || []) {
      if (drawn.has(a)) {
        bands.set(a, []);
        stack.push(a);
        drawnBytes += a.size;
        changed = true;
      } else {
        restBytes += a.size;
      }
    }
    if (changed) restack(x);
    rest.push([x, drawnBytes, restBytes]);
  }
  let peak = 1;
  for (const [, d, r] of rest) peak = Math.max(peak, d + r);

  // Colours: by resource or by stream, each value its palette entry in order of appearance.
  function colourOf(mode) {
    const seen = new Map();
    const colour = (e) => {
      const key = mode === "stream" ? e.stream : e.resource;
      if (!seen.has(key)) seen.set(key, PALETTE[seen.size % PALETTE.length]);
      return seen.get(key);
    };
    colour.seen = seen;
    return colour;
  }
  // An event names its resource by id, or a pool's own events by the pool's handle.
  const kindOf = new Map();
  for (const r of snapshot.resources) {
    kindOf.set(r.id, r.kind.replace("_", " "));
    if (r.pool !== null && r.pool !== undefined && !kindOf.has(r.pool)) kindOf.set(r.pool, r.kind.replace("_", " "));
  }

  const svg = document.getElementById("timeline");
  const info = document.getElementById("info");
  const H = 1000;
  const y = (bytes) => H - (bytes / peak) * (H - 10);
  function polygonPoints(band, size) {
    const top = [], bottom = [];
    for (let i = 0; i < band.length; i++) {
      const [x, off] = band[i];
      const next = i + 1 < band.length ? band[i + 1][0] : x;
      top.push(x + "," + y(off + size), next + "," + y(off + size));
      bottom.push(x + "," + y(off), next + "," + y(off));
    }
    return top.concat(bottom.reverse()).join(" ");
  }
  function show(a) {
    const e = a.event;
    const lines = [
      human(a.size) + " at " + hex(e.address) + " (allocation " + (a.index + 1) + " of " + allocations.length + ")",
      "resource " + hex(e.resource) + ", stream " + hex(e.stream) + ", thread " + e.thread,
      "live from event " + a.start + " to " + (a.end >= moves.length ? "the end" : "event " + a.end),
    ];
    if (e.backtrace) lines.push("backtrace:", ...e.backtrace);
    else lines.push("(recorded without backtraces)");
    info.textContent = lines.join("\n");
  }
  function draw(mode) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const colour = colourOf(mode);
    let count = 0;
    for (const a of allocations) {
      if (!drawn.has(a)) continue;
      const p = document.createElementNS(SVG, "polygon");
      p.setAttribute("points", polygonPoints(bands.get(a), a.size));
      p.setAttribute("fill", colour(a.event));
      p.setAttribute("stroke", "white");
      p.setAttribute("stroke-width", "0.2");
      p.setAttribute("vector-effect", "non-scaling-stroke");
      p.setAttribute("class", "allocation");
      p.addEventListener("mouseover", () => show(a));
      svg.appendChild(p);
      count++;
    }
    if (allocations.length > drawn.size) {
      // The rest, on top of the drawn ones: at most 4,000 points (each the most of its span).
      const step = Math.max(1, Math.ceil(rest.length / 4000));
      const top = [], bottom = [];
      for (let i = 0; i < rest.length; i += step) {
        let best = rest[i];
        for (let j = i; j < Math.min(rest.length, i + step); j++) if (rest[j][1] + rest[j][2] > best[1] + best[2]) best = rest[j];
        top.push(rest[i][0] + "," + y(best[1] + best[2]));
        bottom.push(rest[i][0] + "," + y(best[1]));
      }
      const p = document.createElementNS(SVG, "polygon");
      p.setAttribute("points", top.concat(bottom.reverse()).join(" "));
      p.setAttribute("fill", "#bbbbbb");
      p.addEventListener("mouseover", () => {
        info.textContent = (allocations.length - drawn.size) + " smaller allocations drawn as one band";
      });
      svg.appendChild(p);
    }
    document.body.dataset.drawn = String(count);
    const legend = document.getElementById("key");
    legend.textContent = "";
    for (const [key, c] of colour.seen) {
      const swatch = el("span");
      swatch.style.background = c;
      legend.appendChild(swatch);
      const what = mode === "stream" ? "stream " + hex(key) : (kindOf.get(key) || "resource") + " " + hex(key);
      legend.appendChild(document.createTextNode(what));
    }
  }
  let view = [0, n];
  function setView(from, to) {
    view = [Math.max(0, from), Math.min(n, Math.max(to, from + 1))];
    svg.setAttribute("viewBox", view[0] + " 0 " + (view[1] - view[0]) + " " + H);
  }
  setView(0, n);
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const box = svg.getBoundingClientRect();
    const at = view[0] + ((ev.clientX - box.left) / box.width) * (view[1] - view[0]);
    const scale = ev.deltaY < 0 ? 0.8 : 1.25;
    setView(at - (at - view[0]) * scale, at + (view[1] - at) * scale);
  });
  svg.addEventListener("dblclick", () => setView(0, n));
  const colourSelect = document.getElementById("colour");
  colourSelect.addEventListener("change", () => draw(colourSelect.value));
  draw("resource");

  document.getElementById("headline").textContent =
    snapshot.resources.length + " resource(s), " + snapshot.events.length + " event(s) kept, " +
    snapshot.dropped_events + " dropped; " + allocations.length + " allocation(s) in the history, peak " + human(peak) +
    " live; schema " + snapshot.version;

  // The summary table.
  const table = el("table");
  const head = el("tr");
  for (const h of ["resource", "kind", "device", "reserved", "used", "peak reserved", "peak used", "live", "name"]) {
    head.appendChild(el("th", h === "name" || h === "kind" || h === "resource" ? { class: "l" } : {}, h));
  }
  table.appendChild(head);
  for (const r of snapshot.resources) {
    const row = el("tr");
    const cells = [hex(r.id), r.kind.replace("_", " "), r.device === null ? "-" : r.device, human(r.reserved_bytes),
      human(r.used_bytes), human(r.reserved_peak), human(r.used_peak), r.live_allocations, r.name];
    cells.forEach((c, i) => row.appendChild(el("td", i === 0 || i === 1 || i === 8 ? { class: "l" } : {}, String(c))));
    table.appendChild(row);
  }
  document.getElementById("summary").appendChild(table);

  // The segment map, each segment to the scale of the largest.
  const segments = document.getElementById("segments");
  let largest = 1;
  for (const r of snapshot.resources) for (const s of r.segments) largest = Math.max(largest, s.size);
  let blocksDrawn = 0;
  for (const r of snapshot.resources) {
    if (!r.segments.length) continue;
    segments.appendChild(el("div", {}, r.kind.replace("_", " ") + " " + hex(r.id) + " (" + r.name + ")"));
    for (const s of r.segments) {
      const label = hex(s.address) + " " + human(s.size) + (s.reserved ? " of " + human(s.reserved) + " reserved" : "") +
        ", stream " + hex(s.stream);
      const bar = el("div", { class: "seg", title: label });
      bar.style.width = Math.max(4, (100 * s.size) / largest) + "%";
      for (const b of s.blocks) {
        const state = typeof b.state === "string" ? b.state : "allocated";
        const d = el("div", { class: state, title: human(b.size) + " at " + hex(b.address) + ": " + state +
          (state === "allocated" ? " (" + human(b.state.allocated.requested) + " asked)" : "") });
        d.style.width = (100 * b.size) / s.size + "%";
        bar.appendChild(d);
        blocksDrawn++;
      }
      segments.appendChild(el("div", { style: "font-size:11px" }, label));
      segments.appendChild(bar);
    }
  }
  if (!blocksDrawn) segments.textContent = "no resource with segments";
  document.body.dataset.blocks = String(blocksDrawn);

  // The events before each out-of-memory failure.
  const ooms = document.getElementById("ooms");
  const failures = snapshot.events.map((e, i) => [e, i]).filter(([e]) => e.kind === "out_of_memory");
  if (!failures.length) ooms.textContent = "none recorded";
  for (const [e, i] of failures) {
    ooms.appendChild(el("div", {}, "out of memory: " + human(e.size) + " asked of " + hex(e.resource) + " at " +
      (e.time_ns / 1e9).toFixed(6) + " s, thread " + e.thread));
    const t = el("table");
    const h = el("tr");
    for (const c of ["time (s)", "event", "size", "address", "resource", "stream"]) h.appendChild(el("th", {}, c));
    t.appendChild(h);
    for (const b of snapshot.events.slice(Math.max(0, i - 20), i + 1)) {
      const row = el("tr");
      for (const c of [(b.time_ns / 1e9).toFixed(6), b.kind, human(b.size), hex(b.address), hex(b.resource), hex(b.stream)]) {
        row.appendChild(el("td", {}, c));
      }
      t.appendChild(row);
    }
    ooms.appendChild(t);
  }

  // For tests: `#hover-first` hovers the first drawn allocation once drawn, then turns the
  // wheel once over the timeline's middle (zooming in there); the view it shows is kept in
  // `data-view` before and after.
  if (location.hash === "#hover-first") {
    const first = svg.querySelector("polygon.allocation");
    if (first) first.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    document.body.dataset.viewBefore = view.join(" ");
    const box = svg.getBoundingClientRect();
    svg.dispatchEvent(new WheelEvent("wheel", { deltaY: -100, clientX: box.left + box.width / 2, clientY: box.top + 10,
      bubbles: true, cancelable: true }));
    document.body.dataset.viewAfter = view.join(" ");
  }
  document.body.dataset.ready = "1";
})();
