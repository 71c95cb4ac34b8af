// Interactive curves: every figure.curve[data-curve] on the page becomes a
// uPlot chart (the library is served by the local platform from its installed
// package, never a CDN). The server sends each chart's points as JSON in an
// attribute (escaped by Jinja2, parsed here as data); names reach the page as
// text only. On top of uPlot, which gives the hover values, the legend whose
// entries toggle a run, and drag-to-zoom (double-click resets), this adds
// what a run's curves need: shift-drag (or the middle button) to pan,
// smoothing by an exponential moving average, a log axis, and step, wall-time
// and relative-time axes. The page's .curve-controls form holds those
// settings for every chart on it; changing one redraws them (a chart is at
// most a few thousand points: the server cut longer curves). live.js says
// "dashboard:swapped" when it swaps news in: the new figures are drawn then.
(function () {
  "use strict";

  var PALETTE = ["#1d4ed8", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2",
                 "#db2777", "#65a30d", "#475569", "#b45309"];
  var HEIGHT = 260;
  // Whole steps only: a 3-step run is not labelled 0.5, 1, 1.5...
  var STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4,
                    1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7];

  // The settings as the user last left them: a live page's swap brings a
  // fresh form, which gets them back (see restore).
  var chosen = null;

  function settings() {
    var form = document.querySelector("form.curve-controls");
    var out = { x: "step", log: false, smooth: 0 };
    if (!form) return out;
    out.x = form.elements.x ? form.elements.x.value : "step";
    out.log = form.elements.log ? form.elements.log.checked : false;
    out.smooth = form.elements.smooth ? parseFloat(form.elements.smooth.value) || 0 : 0;
    var shown = form.querySelector(".smooth-value");
    if (shown) shown.textContent = out.smooth.toFixed(2);
    return out;
  }

  function restore() {
    var form = document.querySelector("form.curve-controls");
    if (!form || !chosen) return;
    if (form.elements.x) form.elements.x.value = chosen.x;
    if (form.elements.log) form.elements.log.checked = chosen.log;
    if (form.elements.smooth) form.elements.smooth.value = String(chosen.smooth);
  }

  // The debiased exponential moving average (as TensorBoard and wandb smooth):
  // weight 0 leaves the values as they are, 0.99 nearly flattens them.
  function smooth(values, weight) {
    if (!(weight > 0)) return values.slice();
    var out = new Array(values.length), last = 0, n = 0;
    for (var i = 0; i < values.length; i++) {
      last = last * weight + (1 - weight) * values[i];
      n += 1;
      out[i] = last / (1 - Math.pow(weight, n));
    }
    return out;
  }

  function colour(slot) {
    return PALETTE[slot % PALETTE.length];
  }

  // A run's swatch on the compare page takes the colour its lines are drawn in.
  function paintSwatches() {
    Array.prototype.forEach.call(document.querySelectorAll(".swatch[data-slot]"), function (el) {
      el.style.background = colour(parseInt(el.getAttribute("data-slot"), 10) || 0);
    });
  }

  function fmt(v) {
    return v == null || !isFinite(v) ? "-" : String(+v.toPrecision(6));
  }

  // One series as an [x, y] table for the axis asked, or null when it has no
  // such axis (wall time unknown); values a log axis cannot show are counted.
  function table(series, opts, hidden) {
    var xs;
    if (opts.x === "step") xs = series.step;
    else if (!series.time) return null;
    else if (opts.x === "time") xs = series.time;
    else {
      var t0 = Math.min.apply(null, series.time);
      xs = series.time.map(function (t) { return t - t0; });
    }
    var ys = smooth(series.value, opts.smooth);
    var pairs = xs.map(function (x, i) { return [x, ys[i]]; });
    pairs.sort(function (a, b) { return a[0] - b[0]; });
    var outX = [], outY = [];
    pairs.forEach(function (p) {
      if (opts.log && !(p[1] > 0)) { hidden.count += 1; p[1] = null; }
      outX.push(p[0]);
      outY.push(p[1]);
    });
    return [outX, outY];
  }

  function panOnShiftDrag(u) {
    // Captured on the root, before uPlot's own drag (which selects to zoom).
    u.root.addEventListener("mousedown", function (e) {
      if (!(e.shiftKey || e.button === 1) || !u.over.contains(e.target)) return;
      e.preventDefault();
      e.stopPropagation();
      var x0 = e.clientX, min0 = u.scales.x.min, max0 = u.scales.x.max;
      var perPx = (max0 - min0) / u.over.clientWidth;
      function move(ev) {
        var dx = (ev.clientX - x0) * perPx;
        u.setScale("x", { min: min0 - dx, max: max0 - dx });
      }
      function up() {
        document.removeEventListener("mousemove", move);
        document.removeEventListener("mouseup", up);
      }
      document.addEventListener("mousemove", move);
      document.addEventListener("mouseup", up);
    }, true);
  }

  function note(figure, text) {
    var el = figure.querySelector(".chart-note");
    if (!el) {
      el = document.createElement("p");
      el.className = "chart-note note";
      figure.querySelector(".chart").after(el);
    }
    el.textContent = text;
    el.hidden = !text;
  }

  function draw(figure, opts) {
    var slot = figure.querySelector(".chart");
    if (!slot) return;
    if (figure.__chart) { figure.__chart.destroy(); figure.__chart = null; }
    if (typeof window.uPlot !== "function") {
      note(figure, "the chart script did not load: the caption has the last value");
      return;
    }
    var curve;
    try { curve = JSON.parse(figure.getAttribute("data-curve") || "{}"); } catch (e) { return; }
    var x = { label: axisLabel(opts.x) };
    if (opts.x !== "time") x.value = function (u, v) { return fmt(v); }; // a date, else a number
    var hidden = { count: 0 }, tables = [], series = [x], missing = 0;
    (curve.series || []).forEach(function (s, i) {
      var t = table(s, opts, hidden);
      if (t === null) { missing += 1; return; }
      tables.push(t);
      series.push({
        label: String(s.label),
        stroke: colour(typeof s.slot === "number" ? s.slot : i),
        width: 1.5,
        spanGaps: true,
        value: function (u, v) { return fmt(v); }
      });
    });
    var notes = [];
    if (missing) notes.push(missing + " without wall times (not on this axis)");
    if (hidden.count) notes.push(hidden.count + " values at or below 0 (not on a log axis)");
    note(figure, notes.join("; "));
    // Nothing left to draw (every value hidden by the log axis): the note says why.
    var drawable = tables.some(function (t) { return t[1].some(function (v) { return v !== null; }); });
    if (!drawable) return;
    var data = tables.length === 1 ? tables[0] : window.uPlot.join(tables);
    var chart = new window.uPlot({
      width: Math.max(280, slot.clientWidth || figure.clientWidth - 12),
      height: HEIGHT,
      title: String(curve.name),
      scales: {
        x: { time: opts.x === "time" },
        y: opts.log ? { distr: 3 } : {}
      },
      axes: [
        opts.x === "step" ? { incrs: STEP_INCRS, label: "step" } : { label: axisLabel(opts.x) },
        { values: function (u, ticks) { return ticks.map(fmt); }, size: 60 }
      ],
      // The cursor moves on every chart of the page at once: one step, every metric.
      cursor: { y: false, drag: { x: true, y: false }, sync: { key: "primeruns-curves" } },
      legend: { live: true },
      series: series
    }, data, slot);
    panOnShiftDrag(chart);
    figure.__chart = chart;
  }

  function axisLabel(x) {
    return x === "time" ? "wall time" : x === "relative" ? "seconds since the run's first row" : "step";
  }

  function drawAll() {
    paintSwatches();
    var opts = settings();
    Array.prototype.forEach.call(document.querySelectorAll("figure.curve[data-curve]"),
      function (figure) { draw(figure, opts); });
  }

  function changed(e) {
    if (!(e.target.closest && e.target.closest("form.curve-controls"))) return;
    chosen = settings();
    drawAll();
  }

  document.addEventListener("input", changed);
  document.addEventListener("change", changed);
  document.addEventListener("submit", function (e) {
    if (e.target.matches("form.curve-controls")) e.preventDefault();
  });
  document.addEventListener("dashboard:swapped", function () { restore(); drawAll(); });
  drawAll();
})();
