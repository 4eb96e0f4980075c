//! A small SVG line chart of time series in stacked panels, for the bench's drain-metrics plot
//! (no plotting crate for one picture).

use std::fmt::Write;

/// One line: its legend, colour and points (seconds, value).
pub struct Series {
    pub name: String,
    pub colour: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// One panel: a title and its lines, drawn on a y axis from 0 to their largest value.
pub struct Panel {
    pub title: &'static str,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 760.0;
const PANEL_HEIGHT: f64 = 150.0;
const LEFT: f64 = 50.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 22.0;

/// The chart as an SVG document; all panels share the time axis, from 0 to the last point.
pub fn svg(title: &str, panels: &[Panel]) -> String {
    let t_max = panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0_f64, f64::max)
        .max(0.1);
    let height = TOP + panels.len() as f64 * (PANEL_HEIGHT + BOTTOM + TOP);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"16\" font-size=\"13\">{title}</text>\n"
    );
    for (i, panel) in panels.iter().enumerate() {
        let top = TOP + i as f64 * (PANEL_HEIGHT + BOTTOM + TOP) + TOP;
        draw_panel(&mut out, panel, top, t_max);
    }
    out.push_str("</svg>\n");
    out
}

fn draw_panel(out: &mut String, panel: &Panel, top: f64, t_max: f64) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let y_max = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let x = |t: f64| LEFT + t / t_max * plot_w;
    let y = |v: f64| top + PANEL_HEIGHT - v / y_max * PANEL_HEIGHT;
    let bottom = top + PANEL_HEIGHT;
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"{}\">{}</text>\n\
         <line x1=\"{LEFT}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" stroke=\"#444\"/>\n\
         <line x1=\"{LEFT}\" y1=\"{top}\" x2=\"{LEFT}\" y2=\"{bottom}\" stroke=\"#444\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.1} s</text>",
        top - 6.0,
        panel.title,
        LEFT + plot_w,
        LEFT - 4.0,
        top + 4.0,
        fmt_value(y_max),
        LEFT - 4.0,
        bottom,
        LEFT + plot_w,
        bottom + 14.0,
        t_max,
    );
    for (k, s) in panel.series.iter().enumerate() {
        let points: Vec<String> = s
            .points
            .iter()
            .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
            .collect();
        let ly = top + 10.0 + k as f64 * 16.0;
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"1.8\" points=\"{p}\"/>\n\
             <line x1=\"{lx}\" y1=\"{ly}\" x2=\"{lx2}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"/>\n\
             <text x=\"{tx}\" y=\"{ty}\">{n}</text>",
            c = s.colour,
            p = points.join(" "),
            lx = WIDTH - RIGHT + 12.0,
            lx2 = WIDTH - RIGHT + 30.0,
            tx = WIDTH - RIGHT + 36.0,
            ty = ly + 4.0,
            n = s.name,
        );
    }
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}
