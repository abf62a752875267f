// gpurun report: draws the page's data (view/report_data.h describes the object) with Chart.js,
// which the page inlines before this script. Everything is computed by gpurun; this only draws.
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('gpurun-data').textContent);
  var app = document.getElementById('app');
  var palette = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
                 '#7f7f7f', '#bcbd22', '#17becf'];
  var markColours = {resume: '#2ca02c', restart: '#9467bd', signal: '#ff7f0e', kill: '#d62728',
                     oom: '#8c564b', failure: '#d62728'};

  function element(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  function table(columns, rows, cls) {
    var t = element('table', undefined, cls);
    var head = t.createTHead().insertRow();
    columns.forEach(function (c) { head.appendChild(element('th', c)); });
    var body = t.createTBody();
    rows.forEach(function (r) {
      var row = body.insertRow();
      r.forEach(function (cell) { row.insertCell().textContent = cell; });
    });
    return t;
  }

  // Dashed vertical lines at each mark's position on the chart's x axis (step or minutes).
  var markPlugin = {
    id: 'gpurunMarks',
    afterDatasetsDraw: function (chart, args, options) {
      var marks = options.marks || [];
      if (!marks.length) return;
      var ctx = chart.ctx, area = chart.chartArea, x = chart.scales.x;
      ctx.save();
      ctx.setLineDash([5, 4]);
      ctx.lineWidth = 1.5;
      ctx.font = '11px sans-serif';
      marks.forEach(function (m, i) {
        var value = options.axis === 'minutes' ? m.minutes : m.step;
        var px = x.getPixelForValue(value);
        if (px < area.left - 1 || px > area.right + 1) return;
        ctx.strokeStyle = ctx.fillStyle = markColours[m.kind] || '#444';
        ctx.beginPath();
        ctx.moveTo(px, area.top);
        ctx.lineTo(px, area.bottom);
        ctx.stroke();
        ctx.fillText(m.kind, px + 3, area.top + 12 + 12 * (i % 3));
      });
      ctx.restore();
    }
  };

  // gpurun gives every series a colour index, one per label on the whole page, counted over
  // every series, empty or not: a queue's run keeps its colour in every chart, and a series
  // keeps its colour from a live snapshot (no eval yet) to the finished run's page.
  function colourOf(d) {
    return palette[(typeof d.colour === 'number' ? d.colour : 0) % palette.length];
  }

  // Epochs are whole numbers, drawn half an epoch in from the edges so no point sits on one.
  // Global steps are whole numbers too: no tick between two (a single step's axis showed
  // 9.6, 9.8, 10, 10.2).
  function xScale(spec, datasets) {
    var scale = {type: 'linear', title: {display: true, text: spec.x_label}};
    if (spec.x_axis === 'step') scale.ticks = {precision: 0, includeBounds: false};
    if (spec.x_axis !== 'epoch') return scale;
    var last = 1;
    datasets.forEach(function (d) {
      d.data.forEach(function (p) { last = Math.max(last, p.x); });
    });
    scale.min = 0.5;
    scale.max = last + 0.5;
    scale.afterBuildTicks = function (axis) {
      var ticks = [];
      for (var e = 1; e <= last; ++e) ticks.push({value: e});
      axis.ticks = ticks;
    };
    return scale;
  }

  // A line of one value (a one-epoch run's accuracy, a constant lr): Chart.js would span
  // value - 1 to value + 1, which flattens an accuracy of 0.9 into the axis' middle. Span a
  // twentieth of the value on each side instead (a tenth for a logarithmic axis).
  // A whole-number axis (global steps) spans at least one step each side.
  function flatAxis(axis, values, logarithmic, whole) {
    var finite = values.filter(function (v) { return typeof v === 'number' && isFinite(v); });
    if (!finite.length || finite.some(function (v) { return v !== finite[0]; })) return axis;
    var v = finite[0];
    if (logarithmic) {
      if (v <= 0) return axis;
      axis.min = v / 1.1;
      axis.max = v * 1.1;
    } else {
      var pad = v === 0 ? 1 : Math.abs(v) / 20;
      if (whole) pad = Math.max(1, Math.round(pad));
      axis.min = v - pad;
      axis.max = v + pad;
    }
    return axis;
  }

  function values(datasets, key) {
    return datasets.reduce(function (all, d) {
      return all.concat(d.data.map(function (p) { return p[key]; }));
    }, []);
  }

  function drawChart(spec) {
    var box = element('section', undefined, 'chart');
    box.appendChild(element('h2', spec.title));
    var points = spec.datasets.reduce(function (n, d) { return n + d.points.length; }, 0);
    if (!points) {
      box.appendChild(element('p', 'nothing logged yet', 'empty'));
      app.appendChild(box);
      return;
    }
    var canvas = element('canvas');
    canvas.id = 'chart-' + spec.id;
    canvas.setAttribute('aria-label', spec.title);
    var plot = element('div', undefined, 'plot');  // Chart.js sizes the canvas to this box
    plot.appendChild(canvas);
    box.appendChild(plot);
    app.appendChild(box);
    var datasets = spec.datasets.filter(function (d) { return d.points.length; })
      .map(function (d) {
        var colour = colourOf(d);
        return {
          label: d.label,
          data: d.points.map(function (p) { return {x: p[0], y: p[1]}; }),
          borderColor: colour,
          backgroundColor: colour,
          showLine: d.style !== 'points',
          pointRadius: d.style === 'points' || d.points.length < 30 ? 3 : 0,
          borderWidth: 1.5,
          tension: 0
        };
      });
    var marks = spec.marks ? data.marks : [];
    new Chart(canvas, {
      type: 'scatter',
      data: {datasets: datasets},
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        parsing: false,
        scales: {
          x: spec.x_axis === 'epoch' ? xScale(spec, datasets) :
            flatAxis(xScale(spec, datasets), values(datasets, 'x'), false,
                     spec.x_axis === 'step'),
          y: flatAxis({type: spec.y_scale === 'logarithmic' ? 'logarithmic' : 'linear',
                       title: {display: true, text: spec.y_label}},
                      values(datasets, 'y'), spec.y_scale === 'logarithmic')
        },
        plugins: {
          legend: {position: 'bottom'},
          gpurunMarks: {marks: marks, axis: spec.x_axis}
        }
      },
      plugins: [markPlugin]
    });
  }

  document.title = 'gpurun report: ' + data.title;
  var header = element('header');
  header.appendChild(element('h1', 'gpurun report'));
  header.appendChild(element('p', data.title + ' \u2014 generated ' +
                             new Date(data.generated * 1000).toISOString().replace('T', ' ')
                               .slice(0, 19) + ' UTC', 'subtitle'));
  app.appendChild(header);
  data.notes.forEach(function (n) { app.appendChild(element('p', n, 'note')); });
  app.appendChild(table(['', ''], data.summary, 'summary'));
  var charts = element('div', undefined, 'charts');
  var holder = app;
  app = charts;
  data.charts.forEach(drawChart);
  app = holder;
  app.appendChild(charts);
  data.tables.forEach(function (t) {
    var section;
    if (t.collapsed) {
      section = element('details', undefined, 'table');
      section.appendChild(element('summary', t.title + ' (' + t.rows.length + ' rows)'));
    } else {
      section = element('section', undefined, 'table');
      section.appendChild(element('h2', t.title));
    }
    section.appendChild(table(t.columns, t.rows));
    app.appendChild(section);
  });
  document.body.setAttribute('data-charts', String(document.querySelectorAll('canvas').length));
})();
