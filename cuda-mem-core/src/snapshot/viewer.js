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

  // The timeline, as viewer.rs worked it out of the history: the drawn allocations (the
  // largest, in the order made) and the others' live bytes as one band.
  const timeline = snapshot.timeline;
  const n = Math.max(timeline.moves, 1);
  const allocations = timeline.drawn.map(([number, start, end, size, address, stream, resource, thread, trace]) =>
    ({ number, start, end, size, event: { address, stream, resource, thread,
      backtrace: trace === null ? null : snapshot.traces[trace] } }));

  // Sweep the moves where a drawn allocation starts or ends: the live ones stay stacked in the
  // order they were made; each band is its offsets at the moments they change.
  const stack = [];
  const bands = new Map();
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
  let peak = 1, drawnBytes = 0;
  const moments = Array.from(new Set([...starts.keys(), ...ends.keys()])).sort((p, q) => p - q);
  for (const x of moments) {
    for (const a of ends.get(x) || []) {
      const band = bands.get(a);
      band.push([x, band[band.length - 1][1]]);
      stack.splice(stack.indexOf(a), 1);
      drawnBytes -= a.size;
    }
    for (const a of starts.get(x) || []) {
      bands.set(a, []);
      stack.push(a);
      drawnBytes += a.size;
    }
    restack(x);
    peak = Math.max(peak, drawnBytes);
  }
  const rest = timeline.rest;
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
      human(a.size) + " at " + hex(e.address) + " (allocation " + (a.number + 1) + " of " + timeline.allocations + ")",
      "resource " + hex(e.resource) + ", stream " + hex(e.stream) + ", thread " + e.thread,
      "live from move " + a.start + " to " + (a.end >= timeline.moves ? "the end" : "move " + a.end),
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
    if (rest.length) {
      // The rest, on top of the drawn ones.
      const top = [], bottom = [];
      for (const [x, d, r] of rest) {
        top.push(x + "," + y(d + r));
        bottom.push(x + "," + y(d));
      }
      const p = document.createElementNS(SVG, "polygon");
      p.setAttribute("points", top.concat(bottom.reverse()).join(" "));
      p.setAttribute("fill", "#bbbbbb");
      p.addEventListener("mouseover", () => {
        info.textContent = (timeline.allocations - allocations.length) + " smaller allocations drawn as one band";
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
    snapshot.resources.length + " resource(s), " + snapshot.event_count + " event(s) kept, " +
    snapshot.dropped_events + " dropped; " + timeline.allocations + " allocation(s) in the history (" +
    allocations.length + " drawn one by one), peak " + human(peak) +
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
  // Past BLOCK_BUDGET blocks, neighbours of one state are drawn as one (the page stays usable).
  const BLOCK_BUDGET = 20000;
  let blockCount = 0;
  for (const r of snapshot.resources) for (const s of r.segments) blockCount += s.blocks.length;
  const merge = blockCount > BLOCK_BUDGET;
  const stateOf = (b) => (typeof b.state === "string" ? b.state : "allocated");
  let blocksDrawn = 0;
  for (const r of snapshot.resources) {
    if (!r.segments.length) continue;
    segments.appendChild(el("div", {}, r.kind.replace("_", " ") + " " + hex(r.id) + " (" + r.name + ")"));
    for (const s of r.segments) {
      const label = hex(s.address) + " " + human(s.size) + (s.reserved ? " of " + human(s.reserved) + " reserved" : "") +
        ", stream " + hex(s.stream);
      const bar = el("div", { class: "seg", title: label });
      bar.style.width = Math.max(4, (100 * s.size) / largest) + "%";
      const runs = [];
      for (const b of s.blocks) {
        const last = runs[runs.length - 1];
        if (merge && last && last.state === stateOf(b)) {
          last.size += b.size;
          last.count++;
        } else {
          runs.push({ state: stateOf(b), size: b.size, address: b.address, count: 1, block: b });
        }
      }
      for (const run of runs) {
        const what = run.count > 1
          ? run.count + " " + run.state + " blocks, " + human(run.size) + " from " + hex(run.address)
          : human(run.size) + " at " + hex(run.address) + ": " + run.state +
            (run.state === "allocated" ? " (" + human(run.block.state.allocated.requested) + " asked)" : "");
        const d = el("div", { class: run.state, title: what });
        d.style.width = (100 * run.size) / s.size + "%";
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
  if (!snapshot.ooms.length) ooms.textContent = "none recorded";
  if (snapshot.ooms_not_listed) {
    ooms.appendChild(el("div", {}, snapshot.ooms_not_listed + " earlier failure(s) not listed"));
  }
  for (const { event: e, before } of snapshot.ooms) {
    ooms.appendChild(el("div", {}, "out of memory: " + human(e.size) + " asked of " + hex(e.resource) + " at " +
      (e.time_ns / 1e9).toFixed(6) + " s, thread " + e.thread));
    const t = el("table");
    const h = el("tr");
    for (const c of ["time (s)", "event", "size", "address", "resource", "stream"]) h.appendChild(el("th", {}, c));
    t.appendChild(h);
    for (const b of before.concat([e])) {
      const row = el("tr");
      for (const c of [(b.time_ns / 1e9).toFixed(6), b.kind, human(b.size), hex(b.address), hex(b.resource), hex(b.stream)]) {
        row.appendChild(el("td", {}, c));
      }
      t.appendChild(row);
    }
    ooms.appendChild(t);
  }

  // For tests: `#hover-first` hovers the first drawn allocation once drawn, then turns the
  // wheel once over the timeline's middle (zooming in there) and double-clicks (back to the
  // whole timeline, which a screenshot then shows); the views are kept in `data-view-before`,
  // `data-view-after` and `data-view-reset`.
  if (location.hash === "#hover-first") {
    const first = svg.querySelector("polygon.allocation");
    if (first) first.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    document.body.dataset.viewBefore = view.join(" ");
    const box = svg.getBoundingClientRect();
    svg.dispatchEvent(new WheelEvent("wheel", { deltaY: -100, clientX: box.left + box.width / 2, clientY: box.top + 10,
      bubbles: true, cancelable: true }));
    document.body.dataset.viewAfter = view.join(" ");
    svg.dispatchEvent(new MouseEvent("dblclick", { bubbles: true }));
    document.body.dataset.viewReset = view.join(" ");
  }
  document.body.dataset.ready = "1";
})();
