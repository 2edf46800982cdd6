//! `--markdown DIR`: the finished run written for the documentation.
//!
//! - `DIR/report.md`: the report's tables in markdown, each headed by the
//!   date, the machine (CPU model, CPUs, memory) and the command that made it.
//! - `DIR/roofline.svg`: each operation's speed as a share of the memcpy
//!   measured in the same run, one group of bars per workload.
//!
//! Every figure comes from the [`Report`] just measured; nothing is typed in.
//!
//! The chart is drawn from a flat list of [`Share`]s (workload, operation,
//! table format, percent) and [`Share::place`] alone decides where one goes:
//! one panel per table format, one group per workload, one bar per
//! operation. The report measures f32 tables only, so there is one panel
//! today; rows measured in other formats become more panels (or, by
//! changing `place`, more bars) without touching the drawing.
//!
//! The SVG is written with plotters' SVG backend alone: text goes into the
//! file as `<text>` elements that the viewer draws with its own fonts, so
//! nothing here needs a font file, fontconfig or freetype (plotters lays the
//! text out with its built-in size estimate).

use super::{BYTES_RULE, Impl, MIN_REPS, Report, WARMUP_REPS, candle_layer, formats, layer};
use plotters::backend::SVGBackend;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The table format of every row the report measures today.
const FORMAT_F32: &str = "f32";

/// The chart's size in pixels: width, title band, one panel's height, and
/// the legend column on the right.
const WIDTH: u32 = 1280;
const TITLE_H: u32 = 84;
const PANEL_H: u32 = 500;
const LEGEND_W: u32 = 250;

/// The highest the percent axis goes; a taller bar is cut there and its
/// value printed at the cut.
const AXIS_CAP: f64 = 300.0;

/// Bar colours, one per operation in order of first appearance (cycled).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Writes `dir/report.md` and `dir/roofline.svg` for `report`; returns
/// their paths.
pub fn write(dir: &Path, report: &Report) -> Result<[PathBuf; 2], Box<dyn Error>> {
    std::fs::create_dir_all(dir)?;
    let stamp = Stamp::now(report);
    let shares = shares(report);
    let md = dir.join("report.md");
    let svg = dir.join("roofline.svg");
    std::fs::write(&md, markdown(report, &stamp, &shares)?)?;
    chart(&svg, report, &stamp, &shares)?;
    Ok([md, svg])
}

// ---------------------------------------------------------------------------
// Date and machine
// ---------------------------------------------------------------------------

/// When and where the figures were measured, and by which command.
struct Stamp {
    date: String,
    cpu: String,
    cpus: usize,
    memory: String,
    command: String,
}

impl Stamp {
    fn now(report: &Report) -> Stamp {
        Stamp {
            date: utc_now(),
            cpu: report.machine.cpu.clone(),
            cpus: report.machine.available_parallelism,
            memory: memory_total(),
            command: report.command.clone(),
        }
    }

    /// The machine on one line.
    fn machine(&self) -> String {
        format!("{}, {} CPUs, {} memory", self.cpu, self.cpus, self.memory)
    }

    /// The line that heads every table.
    fn heading(&self) -> String {
        format!("_{} · {} · `{}`_", self.date, self.machine(), self.command)
    }
}

/// The current UTC date and time, as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_date(secs / 86_400);
    let minutes = secs % 86_400 / 60;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        minutes / 60,
        minutes % 60
    )
}

/// (year, month, day) of the Gregorian calendar, `days` after 1970-01-01.
/// Years are counted from 1 March, so that the leap day ends a year, in
/// 400-year eras of 146 097 days.
fn civil_date(days: u64) -> (u64, u64, u64) {
    // 719 468 days from 0000-03-01 to 1970-01-01.
    let z = days + 719_468;
    let (era, day_of_era) = (z / 146_097, z % 146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months from March: 153 days per five months.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

/// The machine's memory from `/proc/meminfo`, in GiB.
fn memory_total() -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<f64>().ok())
        .map_or_else(
            || "unknown".to_string(),
            |kib| format!("{:.1} GiB", kib / (1u64 << 20) as f64),
        )
}

// ---------------------------------------------------------------------------
// The chart's data
// ---------------------------------------------------------------------------

/// One operation's speed on one workload as a share of a memcpy measured in
/// the same run.
struct Share {
    workload: &'static str,
    op: &'static str,
    /// The embedding table's format.
    format: &'static str,
    /// The memcpy it is compared with.
    against: &'static str,
    pct: f64,
}

impl Share {
    /// Where the share goes in the chart: (panel, group, bar).
    fn place(&self) -> (&'static str, &'static str, &'static str) {
        (self.format, self.workload, self.op)
    }
}

/// The shares of the run: the crate's kernels on the pool (`simd_rayon`)
/// against a memcpy of the bytes they move, the layer ops whose baseline is
/// a memcpy (the speed-up over it, as a percent), and the format rows of
/// the reduced formats, one panel each. Layer ops judged against a memset
/// or another kernel are in the tables only.
fn shares(report: &Report) -> Vec<Share> {
    let kernels = report
        .rows
        .iter()
        .filter(|r| r.implementation == Impl::SimdRayon.name())
        .map(|r| Share {
            workload: r.workload,
            op: r.kernel,
            format: FORMAT_F32,
            against: "memcpy of the bytes it moves",
            pct: r.pct_of_roofline,
        });
    let layers = report.layer_rows.iter().filter_map(|r| {
        let against = match r.baseline {
            "memcpy" if r.op.starts_with("bag_") => "memcpy of the rows it reads",
            "memcpy" => "memcpy of its output",
            "memcpy_warm" => "memcpy of the rows it reads, both warm",
            _ => return None,
        };
        Some(Share {
            workload: r.workload,
            op: r.op,
            format: FORMAT_F32,
            against,
            pct: 100.0 * r.speedup_vs_baseline,
        })
    });
    // The f32 format rows repeat the f32 panel's gather and bag sum (against
    // another yardstick); they stay in the tables only.
    let formats = report.format_rows.iter().filter(|r| r.format != FORMAT_F32);
    let formats = formats.map(|r| Share {
        workload: r.workload,
        op: r.op,
        format: r.format,
        against: "memcpy of the bytes it moves",
        pct: r.pct_of_roofline,
    });
    kernels.chain(layers).chain(formats).collect()
}

/// The distinct values of `key` over `items`, in order of first appearance.
fn distinct<T>(items: &[T], key: impl Fn(&T) -> &'static str) -> Vec<&'static str> {
    let mut seen = Vec::new();
    for item in items {
        let k = key(item);
        if !seen.contains(&k) {
            seen.push(k);
        }
    }
    seen
}

// ---------------------------------------------------------------------------
// report.md
// ---------------------------------------------------------------------------

fn markdown(report: &Report, stamp: &Stamp, shares: &[Share]) -> Result<String, Box<dyn Error>> {
    let m = &report.machine;
    let mut s = String::new();
    writeln!(s, "# embedding-kernels benchmark report\n")?;
    writeln!(
        s,
        "Written by the report itself: every figure below and in the chart comes from one run of\n\
         `{}`.\n",
        stamp.command
    )?;
    writeln!(s, "- date: {}", stamp.date)?;
    writeln!(s, "- machine: {}", stamp.machine())?;
    writeln!(
        s,
        "- threads: rayon pool of {} (local pool); SIMD: {}",
        m.pool_threads, m.simd
    )?;
    writeln!(
        s,
        "- memory: {}",
        if m.huge_pages {
            "tables and gradients in transparent huge pages"
        } else {
            "tables and gradients in plain `vec!` allocations (4 KiB pages)"
        }
    )?;
    if !m.release_build {
        writeln!(s, "- **debug build: the numbers mean nothing**")?;
    }
    let reps = match (report.reps_per_row, report.budget_ms_per_row) {
        (Some(r), _) => format!("{r} timed repetitions per row"),
        (None, Some(ms)) => format!("repetitions for ~{ms} ms per row (at least {MIN_REPS})"),
        (None, None) => "repetitions per row".to_string(),
    };
    writeln!(
        s,
        "- timing: median; {WARMUP_REPS} warm-up calls, then {reps}, round-robin with the baselines"
    )?;
    let load = |l: &Option<String>| l.clone().unwrap_or_else(|| "-".to_string());
    writeln!(
        s,
        "- load (1/5/15 min): {} at start, {} at end (the machine is shared)",
        load(&m.loadavg_at_start),
        load(&m.loadavg_at_end)
    )?;
    writeln!(s, "- wall time: {:.0} s\n", report.wall_seconds)?;
    writeln!(
        s,
        "![Each operation's speed as a share of a same-run memcpy](roofline.svg)\n"
    )?;

    share_table(&mut s, stamp, shares)?;
    workload_table(&mut s, report, stamp)?;
    kernel_table(&mut s, report, stamp)?;
    layer_table(&mut s, report, stamp)?;
    format_table(&mut s, report, stamp)?;
    candle_table(&mut s, report, stamp)?;
    target_table(&mut s, report, stamp)?;
    Ok(s)
}

/// The chart's figures: one row per operation (and format), one column per
/// workload.
fn share_table(s: &mut String, stamp: &Stamp, shares: &[Share]) -> std::fmt::Result {
    writeln!(s, "## Share of the memory roofline\n")?;
    writeln!(s, "{}\n", stamp.heading())?;
    if shares.is_empty() {
        return writeln!(s, "Nothing in this run is compared with a memcpy.\n");
    }
    let workloads = distinct(shares, |x| x.workload);
    let formats = distinct(shares, |x| x.format);
    let ops = distinct(shares, |x| x.op);
    write!(s, "| operation | format | compared with |")?;
    workloads.iter().try_for_each(|w| write!(s, " {w} |"))?;
    write!(s, "\n| --- | --- | --- |")?;
    workloads.iter().try_for_each(|_| write!(s, " ---: |"))?;
    writeln!(s)?;
    for format in &formats {
        for op in &ops {
            let of = |w: &str| {
                shares
                    .iter()
                    .find(|x| x.format == *format && x.op == *op && x.workload == w)
            };
            let Some(first) = workloads.iter().find_map(|w| of(w)) else {
                continue;
            };
            write!(s, "| {op} | {format} | {} |", first.against)?;
            for w in &workloads {
                match of(w) {
                    Some(x) => write!(s, " {:.0} % |", x.pct)?,
                    None => write!(s, " - |")?,
                }
            }
            writeln!(s)?;
        }
    }
    writeln!(
        s,
        "\nThe kernels run as `simd_rayon` (the crate's kernel on the report's pool) and are \
         compared by bytes moved (counted as below) per second; the layer ops run with \
         `Parallelism::Auto` and are compared by time. The memcpy is the faster of one thread and \
         the whole pool, timed round-robin with the operation. Above 100 %, the operation beats \
         a copy of the same bytes (a bag reads many rows and writes one).\n"
    )
}

fn workload_table(s: &mut String, report: &Report, stamp: &Stamp) -> std::fmt::Result {
    writeln!(s, "## Workloads\n")?;
    writeln!(s, "{}\n", stamp.heading())?;
    writeln!(
        s,
        "| workload | table rows | dim | table MB | ids | distinct ids | output MB |"
    )?;
    writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    let mb = |floats: usize| (floats * 4) as f64 / (1 << 20) as f64;
    for w in &report.workloads {
        writeln!(
            s,
            "| {} | {} | {} | {:.1} | {} | {} | {:.1} |",
            w.name,
            w.num_embeddings,
            w.dim,
            mb(w.num_embeddings * w.dim),
            w.num_ids,
            w.distinct_ids,
            mb(w.num_ids * w.dim)
        )?;
    }
    writeln!(s)
}

fn kernel_table(s: &mut String, report: &Report, stamp: &Stamp) -> std::fmt::Result {
    writeln!(s, "## Kernels\n")?;
    writeln!(s, "{}\n", stamp.heading())?;
    if report.rows.is_empty() {
        return writeln!(s, "No kernel rows in this run.\n");
    }
    writeln!(
        s,
        "| workload | kernel | impl | median µs | GB/s | roof GB/s | % roof | vs scalar | reps | same as scalar |"
    )?;
    writeln!(
        s,
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )?;
    for r in &report.rows {
        let speedup = r
            .speedup_vs_scalar
            .map_or("-".to_string(), |x| format!("{x:.2}x"));
        let same = match (r.matches_scalar, r.max_abs_diff_vs_scalar) {
            (Some(true), _) => "yes".to_string(),
            (Some(false), Some(d)) => format!("**no** (max diff {d:e})"),
            (Some(false), None) => "**no**".to_string(),
            (None, _) => "-".to_string(),
        };
        writeln!(
            s,
            "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.1} % | {} | {} | {} |",
            r.workload,
            r.kernel,
            r.implementation,
            r.stats.median_us,
            r.gbps,
            r.roofline_gbps,
            r.pct_of_roofline,
            speedup,
            r.stats.reps,
            same
        )?;
    }
    writeln!(
        s,
        "\n{BYTES_RULE} roof GB/s: the faster median of a memcpy of ids×dim floats on one thread \
         and split over the pool, measured round-robin with that row (the memcpy rows pool all of \
         a workload's memcpy samples). vs scalar: scalar median / row median. scalar = \
         `reference::loops`, simd_1t = `Parallelism::Serial`, simd_rayon = `Parallelism::Rayon` \
         in the pool, `_4k` = the same on a copy of the table in a plain `Vec` (4 KiB pages), candle = candle-core `index_select` / `index_add` (its scatter_add returns \
         a new tensor, so its time includes copying the zeroed table; its gather_scaled is two \
         passes).\n"
    )
}

fn layer_table(s: &mut String, report: &Report, stamp: &Stamp) -> std::fmt::Result {
    writeln!(s, "## Layer ops\n")?;
    writeln!(s, "{}\n", stamp.heading())?;
    if report.layer_rows.is_empty() {
        return writeln!(s, "No layer rows in this run.\n");
    }
    writeln!(
        s,
        "| workload | layer op | median µs | baseline | baseline µs | speed-up | reps |"
    )?;
    writeln!(s, "| --- | --- | ---: | --- | ---: | ---: | ---: |")?;
    for r in &report.layer_rows {
        writeln!(
            s,
            "| {} | {} | {:.1} | {} | {:.1} | {:.2}x | {} |",
            r.workload,
            r.op,
            r.stats.median_us,
            r.baseline,
            r.baseline_median_us,
            r.speedup_vs_baseline,
            r.stats.reps
        )?;
    }
    // The legend's lines are wrapped for a terminal; one paragraph here.
    let legend: Vec<&str> = layer::LEGEND.lines().map(str::trim).collect();
    writeln!(s, "\n{}.\n", legend.join(" "))
}

fn candle_table(s: &mut String, report: &Report, stamp: &Stamp) -> std::fmt::Result {
    writeln!(s, "## candle layers\n")?;
    writeln!(s, "{}\n", stamp.heading())?;
    if report.candle_layer_rows.is_empty() {
        return writeln!(s, "No candle_layer rows in this run.\n");
    }
    writeln!(
        s,
        "| workload | op | ours µs | candle_nn µs | kernel µs | accumulate µs | vs candle_nn | ours / kernel | same bits | reps |"
    )?;
    writeln!(
        s,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"
    )?;
    for r in &report.candle_layer_rows {
        let accumulate = r
            .accumulate
            .map_or("–".to_string(), |a| format!("{:.1}", a.median_us));
        writeln!(
            s,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.2}x | {:.2}x | {} | {} |",
            r.workload,
            r.op,
            r.ours.median_us,
            r.candle_nn.median_us,
            r.kernel.median_us,
            accumulate,
            r.speedup_vs_candle_nn,
            r.time_vs_kernel,
            if r.results_match { "yes" } else { "**no**" },
            r.ours.reps
        )?;
    }
    let legend: Vec<&str> = candle_layer::LEGEND.lines().map(str::trim).collect();
    writeln!(s, "\n{}.\n", legend.join(" "))
}

fn format_table(s: &mut String, report: &Report, stamp: &Stamp) -> std::fmt::Result {
    writeln!(s, "## Table formats\n")?;
    writeln!(s, "{}\n", stamp.heading())?;
    if report.format_rows.is_empty() {
        return writeln!(s, "No format rows in this run.\n");
    }
    writeln!(
        s,
        "| workload | op | format | median µs | GB/s | roof GB/s | % roof | vs f32 | reps |"
    )?;
    writeln!(
        s,
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    for r in &report.format_rows {
        let vs = r
            .time_vs_f32
            .map_or("-".to_string(), |v| format!("{v:.2}x"));
        writeln!(
            s,
            "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.1} % | {vs} | {} |",
            r.workload,
            r.op,
            r.format,
            r.stats.median_us,
            r.gbps,
            r.roofline_gbps,
            r.pct_of_roofline,
            r.stats.reps
        )?;
    }
    let legend: Vec<&str> = formats::LEGEND.lines().map(str::trim).collect();
    if !formats::has_cold_rows(&report.format_rows) {
        return writeln!(s, "\n{}.\n", legend.join(" "));
    }
    let caches = formats::caches_line(report.format_eviction_bytes);
    let caches: Vec<&str> = caches.lines().map(str::trim).collect();
    writeln!(s, "\n{}; {}.\n", legend.join(" "), caches.join(" "))
}

fn target_table(s: &mut String, report: &Report, stamp: &Stamp) -> std::fmt::Result {
    writeln!(s, "## Targets (checked, not asserted)\n")?;
    writeln!(s, "{}\n", stamp.heading())?;
    writeln!(s, "| goal | measured | verdict |")?;
    writeln!(s, "| --- | ---: | --- |")?;
    for t in &report.targets {
        let (value, verdict) = match t.shown(" %") {
            Some((v, met)) => (v, if met { "met" } else { "**not met**" }),
            None => ("-".to_string(), "not measured in this run"),
        };
        writeln!(s, "| {} | {value} | {verdict} |", t.goal)?;
    }
    writeln!(s)
}

// ---------------------------------------------------------------------------
// roofline.svg
// ---------------------------------------------------------------------------

/// Grouped bars: one panel per table format, one group per workload, one
/// bar per operation, a dashed line at 100 %.
fn chart(
    path: &Path,
    report: &Report,
    stamp: &Stamp,
    shares: &[Share],
) -> Result<(), Box<dyn Error>> {
    let places: Vec<_> = shares.iter().map(Share::place).collect();
    let panels = distinct(&places, |p| p.0);
    let groups = distinct(&places, |p| p.1);
    let bars = distinct(&places, |p| p.2);
    let height = TITLE_H + PANEL_H * panels.len().max(1) as u32;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;

    let font = |size: f64| ("sans-serif", size).into_font();
    let centred = Pos::new(HPos::Center, VPos::Top);
    root.draw_text(
        "embedding-kernels: speed as a share of a same-run memcpy (the memory roofline)",
        &font(24.0).style(FontStyle::Bold).color(&BLACK).pos(centred),
        (WIDTH as i32 / 2, 10),
    )?;
    root.draw_text(
        &format!("{} · {}", stamp.date, stamp.machine()),
        &font(15.0).color(&BLACK).pos(centred),
        (WIDTH as i32 / 2, 42),
    )?;
    root.draw_text(
        &stamp.command,
        &("monospace", 13.0)
            .into_font()
            .color(&BLACK.mix(0.7))
            .pos(centred),
        (WIDTH as i32 / 2, 63),
    )?;
    let (_, body) = root.split_vertically(TITLE_H);
    let (plots, legend) = body.split_horizontally(WIDTH - LEGEND_W);

    if shares.is_empty() {
        plots.draw_text(
            "nothing in this run is compared with a memcpy",
            &font(18.0).color(&BLACK).pos(centred),
            ((WIDTH - LEGEND_W) as i32 / 2, PANEL_H as i32 / 2),
        )?;
        root.present()?;
        return Ok(());
    }

    let top = shares.iter().map(|x| x.pct).fold(100.0, f64::max);
    let y_max = ((top * 1.12 / 20.0).ceil() * 20.0).min(AXIS_CAP);
    let colour = |bar: usize| PALETTE[bar % PALETTE.len()];
    let n_groups = groups.len() as f64;
    // Each group spans one unit of x; its bars share the middle 84 %.
    let slot = 0.84 / bars.len() as f64;
    let bar_x = |group: usize, bar: usize| group as f64 + 0.08 + slot * bar as f64;

    for (panel_area, panel) in plots.split_evenly((panels.len(), 1)).iter().zip(&panels) {
        let mut chart = ChartBuilder::on(panel_area)
            .caption(format!("{panel} tables"), font(17.0).style(FontStyle::Bold))
            .margin_left(10)
            .margin_right(20)
            .margin_top(6)
            .x_label_area_size(58)
            .y_label_area_size(74)
            .build_cartesian_2d(0.0..n_groups, 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(((y_max / 20.0) as usize + 1).min(16))
            .y_label_formatter(&|v| format!("{v:.0} %"))
            .y_desc("% of the same-run memcpy (higher is faster)")
            .axis_desc_style(font(15.0))
            .label_style(font(13.0))
            .light_line_style(WHITE)
            .bold_line_style(BLACK.mix(0.12))
            .draw()?;

        // This panel's bars: (bar index, group index, share).
        let mine: Vec<(usize, usize, &Share)> = shares
            .iter()
            .zip(&places)
            .filter(|(_, p)| p.0 == *panel)
            .filter_map(|(x, p)| {
                let b = bars.iter().position(|b| *b == p.2)?;
                let g = groups.iter().position(|g| *g == p.1)?;
                Some((b, g, x))
            })
            .collect();
        chart.draw_series(mine.iter().map(|&(b, g, x)| {
            let x0 = bar_x(g, b);
            Rectangle::new(
                [
                    (x0 + slot * 0.08, 0.0),
                    (x0 + slot * 0.92, x.pct.min(y_max)),
                ],
                colour(b).filled(),
            )
        }))?;
        chart.draw_series(std::iter::once(DashedPathElement::new(
            vec![(0.0, 100.0), (n_groups, 100.0)],
            8,
            5,
            BLACK.stroke_width(2),
        )))?;
        // The value above each bar, written upwards; red where the bar is
        // cut at the top of the axis.
        for &(b, g, x) in &mine {
            let (px, py) = chart.backend_coord(&(bar_x(g, b) + slot / 2.0, x.pct.min(y_max)));
            let style = font(11.0)
                .color(if x.pct > y_max { &RED } else { &BLACK })
                .transform(FontTransform::Rotate270)
                .pos(Pos::new(HPos::Left, VPos::Center));
            let text = format!("{:.0}", x.pct);
            // A white backing, so the 100 % line and the grid do not run
            // through the digits (under 6 px a digit at this size).
            let len = 6 * text.len() as i32 + 5;
            root.draw(&Rectangle::new(
                [(px - 6, py - 3 - len), (px + 6, py - 1)],
                WHITE.filled(),
            ))?;
            root.draw_text(&text, &style, (px, py - 3))?;
        }

        // The workload names under their groups, with their shapes.
        for (g, name) in groups.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
            root.draw_text(
                name,
                &font(16.0).style(FontStyle::Bold).color(&BLACK).pos(centred),
                (px, py + 8),
            )?;
            if let Some(w) = report.workloads.iter().find(|w| w.name == *name) {
                root.draw_text(
                    &format!("{} × {}, {} ids", w.num_embeddings, w.dim, w.num_ids),
                    &font(12.0).color(&BLACK.mix(0.7)).pos(centred),
                    (px, py + 30),
                )?;
            }
        }
    }

    // The legend: one swatch per operation, then what the bars mean.
    let left = Pos::new(HPos::Left, VPos::Center);
    legend.draw_text(
        "operation",
        &font(15.0).style(FontStyle::Bold).color(&BLACK).pos(left),
        (10, 40),
    )?;
    for (b, bar) in bars.iter().enumerate() {
        let y = 66 + 24 * b as i32;
        legend.draw(&Rectangle::new(
            [(10, y - 8), (28, y + 8)],
            colour(b).filled(),
        ))?;
        legend.draw_text(bar, &font(14.0).color(&BLACK).pos(left), (36, y))?;
    }
    let mut y = 66 + 24 * bars.len() as i32 + 12;
    legend.draw(&DashedPathElement::new(
        vec![(10, y), (28, y)],
        5,
        3,
        BLACK.stroke_width(2),
    ))?;
    legend.draw_text(
        "memcpy = 100 %",
        &font(14.0).color(&BLACK).pos(left),
        (36, y),
    )?;
    y += 34;
    let notes = [
        "kernels: simd_rayon, by bytes",
        "moved; layer ops: by time",
        "(Parallelism::Auto). Pool of",
        &format!("{} threads; memcpy: the", report.machine.pool_threads),
        "faster of 1 thread and the pool,",
        "timed round-robin with the op.",
    ];
    let bag_notes = [
        "Bags read 16 rows per output",
        "row, so they can pass 100 %.",
    ];
    let has_bags = bars.iter().any(|b| b.starts_with("bag_"));
    for line in notes
        .into_iter()
        .chain(bag_notes.into_iter().filter(|_| has_bags))
    {
        legend.draw_text(line, &font(12.0).color(&BLACK.mix(0.75)).pos(left), (10, y))?;
        y += 17;
    }
    root.present()?;
    Ok(())
}
