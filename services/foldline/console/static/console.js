// The console's own script: the charts (uPlot) and a session page's live updates (server-sent events).
// Everything it inserts into a page is HTML the server rendered with every log value escaped; it reads
// chart data from data-chart attributes (JSON) and never evaluates text.
(function () {
  "use strict";

  var COLORS = {
    input: "#4e79a7",
    read: "#59a14f",
    write: "#f28e2b",
    output: "#7b3294",
    spend: "#222222",
    prompt: "#4e79a7",
    ratio: "#59a14f",
    explained: "#e0a030",
    unexplained: "#d62728",
  };

  function drawDrops(u, drops) {
    var ctx = u.ctx;
    var top = u.bbox.top;
    var bottom = u.bbox.top + u.bbox.height;
    ctx.save();
    ctx.lineWidth = 2 * uPlot.pxRatio;
    ctx.font = 11 * uPlot.pxRatio + "px sans-serif";
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    for (var i = 0; i < drops.length; i++) {
      var d = drops[i];
      var x = Math.round(u.valToPos(d.x, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      var colour = d.explained ? COLORS.explained : COLORS.unexplained;
      ctx.strokeStyle = colour;
      ctx.fillStyle = colour;
      ctx.setLineDash(d.explained ? [4 * uPlot.pxRatio, 3 * uPlot.pxRatio] : []);
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, bottom);
      ctx.stroke();
      if (drops.length <= 40) ctx.fillText(d.cause, x + 3 * uPlot.pxRatio, top + 2 * uPlot.pxRatio);
    }
    ctx.restore();
  }

  function width(el) {
    return Math.max(320, el.clientWidth || 900);
  }

  function stepChart(el, data) {
    var c = data.columns; // [index, input, cache read, cache write, output, spend]
    var state = { columns: c, drops: data.drops };
    var opts = {
      width: width(el),
      height: 320,
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false }, tok: { auto: true }, money: { auto: true } },
      axes: [
        { label: "step (0-based, log order)" },
        { scale: "tok", label: "tokens", size: 70 },
        { scale: "money", side: 1, label: data.currency, grid: { show: false }, size: 70 },
      ],
      series: [
        { label: "step" },
        { label: "input (uncached)", scale: "tok", stroke: COLORS.input, width: 1.5 },
        { label: "cache read", scale: "tok", stroke: COLORS.read, width: 1.5 },
        { label: "cache write", scale: "tok", stroke: COLORS.write, width: 1.5 },
        { label: "output", scale: "tok", stroke: COLORS.output, width: 2, dash: [6, 3] },
        { label: "spend (" + data.currency + ")", scale: "money", stroke: COLORS.spend, width: 1.5, dash: [2, 2],
          value: function (u, v, si, i) { return i == null ? "--" : v == null ? "unknown" : v.toFixed(6); } },
      ],
      hooks: { draw: [function (u) { drawDrops(u, state.drops); }] },
    };
    var u = new uPlot(opts, c, el);
    state.plot = u;
    state.update = function (points, drops) {
      for (var i = 0; i < points.length; i++) {
        var p = points[i];
        var at = p[0];
        for (var k = 0; k < 6; k++) state.columns[k][at] = p[k];
      }
      for (var j = 0; j < drops.length; j++) {
        var known = false;
        for (var m = 0; m < state.drops.length; m++) if (state.drops[m].x === drops[j].x) { state.drops[m] = drops[j]; known = true; }
        if (!known) state.drops.push(drops[j]);
      }
      u.setData(state.columns);
    };
    return state;
  }

  function fleetChart(el, data) {
    var c = data.columns; // [hour (s), spend, cache-read ratio]
    var opts = {
      width: width(el),
      height: 280,
      scales: { x: { time: true }, money: { auto: true }, ratio: { range: [0, 1] } },
      axes: [
        {},
        { scale: "money", label: data.currency, size: 70 },
        { scale: "ratio", side: 1, label: "cache-read ratio", grid: { show: false }, size: 60,
          values: function (u, vals) { return vals.map(function (v) { return Math.round(v * 100) + "%"; }); } },
      ],
      series: [
        {},
        { label: "spend (" + data.currency + ")", scale: "money", stroke: COLORS.prompt, fill: "rgba(78,121,167,0.25)",
          paths: uPlot.paths.bars({ size: [0.6, 60] }) },
        { label: "cache-read ratio", scale: "ratio", stroke: COLORS.ratio, width: 2 },
      ],
    };
    return { plot: new uPlot(opts, c, el) };
  }

  var charts = [];

  function setUpCharts() {
    var els = document.querySelectorAll("[data-chart]");
    for (var i = 0; i < els.length; i++) {
      var el = els[i];
      if (el.getAttribute("data-drawn")) continue;
      var data = JSON.parse(el.getAttribute("data-chart"));
      var chart = el.getAttribute("data-kind") === "fleet" ? fleetChart(el, data) : stepChart(el, data);
      chart.el = el;
      el.setAttribute("data-drawn", "1");
      charts.push(chart);
    }
  }

  function stepChartState() {
    for (var i = 0; i < charts.length; i++) if (charts[i].update) return charts[i];
    return null;
  }

  function applyRows(tbody, html) {
    var holder = document.createElement("tbody");
    holder.innerHTML = html; // rendered and escaped by the server
    var rows = Array.prototype.slice.call(holder.children);
    for (var i = 0; i < rows.length; i++) {
      var row = rows[i];
      var key = row.getAttribute("data-index") !== null
        ? '[data-index="' + row.getAttribute("data-index") + '"]'
        : '[data-turn-row="' + row.getAttribute("data-turn-row") + '"]';
      var old = tbody.querySelector(key);
      if (old) old.replaceWith(row);
      else tbody.appendChild(row);
    }
  }

  function goLive() {
    var table = document.querySelector("[data-live]");
    if (!table || !window.EventSource) return;
    var source = new EventSource(table.getAttribute("data-live"));
    source.addEventListener("update", function (event) {
      var update = JSON.parse(event.data);
      applyRows(document.getElementById("timeline-rows"), update.rows);
      var stats = document.getElementById("stats");
      if (stats) stats.innerHTML = update.stats; // rendered and escaped by the server
      var chart = stepChartState();
      if (chart) chart.update(update.points, update.drops);
      document.body.setAttribute("data-head", String(update.head));
    });
  }

  window.addEventListener("resize", function () {
    for (var i = 0; i < charts.length; i++) charts[i].plot.setSize({ width: width(charts[i].el), height: charts[i].plot.height });
  });

  document.addEventListener("DOMContentLoaded", function () {
    setUpCharts();
    goLive();
  });
})();
