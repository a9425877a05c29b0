//! Charts drawn server-side as SVG by `plotters`: grouped (or stacked) bars over named
//! categories, with each value written above its bar so the numbers can be read (and
//! checked) as text. Everything is drawn with presentation attributes (`fill=`,
//! `stroke=`), none with inline `style`, so the strict Content-Security-Policy of the
//! dashboard does not block any of it.
use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Colours of the series, in order (readable on white, distinct for colour-blind eyes).
const PALETTE: [RGBColor; 4] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
];

/// One series of bars: a name (the legend) and one value per category.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) values: Vec<f64>,
}

/// How the series of a chart sit together.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Side by side in each category.
    Grouped,
    /// On top of each other in each category.
    Stacked,
}

/// A bar chart to draw.
pub(crate) struct BarChart<'a> {
    /// Category names along the x axis.
    pub(crate) categories: &'a [String],
    /// Label only every n-th category (1: all).
    pub(crate) label_every: usize,
    /// The y axis' description.
    pub(crate) y_desc: &'a str,
    /// The series.
    pub(crate) series: &'a [Series],
    /// Grouped or stacked.
    pub(crate) layout: Layout,
    /// Write each non-zero value above its bar.
    pub(crate) value_labels: bool,
    /// How a value is written.
    pub(crate) format: fn(f64) -> String,
    /// Size in pixels.
    pub(crate) size: (u32, u32),
}

/// A whole number as text.
pub(crate) fn count(v: f64) -> String {
    format!("{v:.0}")
}

/// Milliseconds as text.
pub(crate) fn millis(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

/// An x axis over categories: a linear axis whose ticks sit at the centre of each
/// (labelled) category.
struct CategoryAxis {
    inner: RangedCoordf64,
    centres: Vec<f64>,
}

impl Ranged for CategoryAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        self.centres.clone()
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

impl BarChart<'_> {
    /// The chart as an SVG document, or why it could not be drawn.
    pub(crate) fn svg(&self) -> Result<String, String> {
        let mut out = String::new();
        self.draw(&mut out).map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn draw(&self, out: &mut String) -> Result<(), Box<dyn std::error::Error + '_>> {
        let n = self.categories.len().max(1);
        let slots = match self.layout {
            Layout::Grouped => self.series.len().max(1),
            Layout::Stacked => 1,
        };
        // Each category takes `slots` bar widths plus one of gap.
        let width = (slots + 1) as f64;
        let top = self.top();
        let centres: Vec<f64> = (0..n)
            .step_by(self.label_every.max(1))
            .map(|i| i as f64 * width + (slots as f64) / 2.0 + 0.5)
            .collect();
        let categories = self.categories;
        let root = SVGBackend::with_string(out, self.size).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(
                CategoryAxis {
                    inner: (0.0..n as f64 * width).into(),
                    centres,
                },
                0.0..top,
            )?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_max_light_lines(0)
            .y_max_light_lines(0)
            .y_desc(self.y_desc)
            .y_labels(5)
            .y_label_formatter(&|v| (self.format)(*v))
            .x_label_formatter(&|x| {
                let i = (x / width).floor();
                if i >= 0.0 && (i as usize) < categories.len() {
                    categories[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .label_style(("sans-serif", 13))
            .draw()?;
        let mut stack = vec![0.0; n];
        for (s, series) in self.series.iter().enumerate() {
            let colour = PALETTE[s % PALETTE.len()];
            let mut bars = Vec::new();
            let mut labels = Vec::new();
            for (i, value) in series.values.iter().copied().enumerate().take(n) {
                let left = i as f64 * width + 0.5;
                let (x0, y0) = match self.layout {
                    Layout::Grouped => (left + s as f64, 0.0),
                    Layout::Stacked => (left, stack[i]),
                };
                let y1 = y0 + value;
                stack[i] = y1;
                if value > 0.0 {
                    bars.push(Rectangle::new([(x0, y0), (x0 + 1.0, y1)], colour.filled()));
                    if self.value_labels {
                        labels.push(Text::new(
                            (self.format)(value),
                            (x0 + 0.5, y1),
                            ("sans-serif", 12)
                                .into_font()
                                .color(&BLACK)
                                .pos(Pos::new(HPos::Center, VPos::Bottom)),
                        ));
                    }
                }
            }
            let drawn = chart.draw_series(bars)?;
            if self.series.len() > 1 {
                drawn.label(series.name.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled())
                });
            }
            chart.draw_series(labels)?;
        }
        if self.series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK.mix(0.3))
                .label_font(("sans-serif", 12))
                .draw()?;
        }
        root.present()?;
        Ok(())
    }

    /// The top of the y axis: the highest bar (or stack) plus room for its label.
    fn top(&self) -> f64 {
        let n = self.categories.len();
        let highest = match self.layout {
            Layout::Grouped => self
                .series
                .iter()
                .flat_map(|s| s.values.iter().copied())
                .fold(0.0, f64::max),
            Layout::Stacked => (0..n)
                .map(|i| {
                    self.series
                        .iter()
                        .map(|s| s.values.get(i).copied().unwrap_or(0.0))
                        .sum::<f64>()
                })
                .fold(0.0, f64::max),
        };
        // Room above the highest bar for its label, and for the legend when there is one.
        let room = if self.series.len() > 1 { 1.45 } else { 1.2 };
        if highest <= 0.0 {
            1.0
        } else {
            highest * room
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn chart(categories: &[String], series: &[Series]) -> String {
        BarChart {
            categories,
            label_every: 1,
            y_desc: "tasks",
            series,
            layout: Layout::Grouped,
            value_labels: true,
            format: count,
            size: (480, 240),
        }
        .svg()
        .expect("a chart")
        // Each text element's content sits on a line of its own.
        .replace('\n', "")
    }

    #[test]
    fn values_and_categories_are_written_as_text() {
        let svg = chart(
            &["pending".into(), "dead".into()],
            &[Series {
                name: "tasks".into(),
                values: vec![7.0, 3.0],
            }],
        );
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains(">pending<") && svg.contains(">dead<"), "{svg}");
        assert!(svg.contains(">7<") && svg.contains(">3<"), "{svg}");
        // Nothing the dashboard's policy would block.
        assert!(!svg.contains("style="), "{svg}");
    }

    #[test]
    fn labels_are_escaped() {
        let svg = chart(
            &["<script>alert(1)</script>".into()],
            &[Series {
                name: "tasks".into(),
                values: vec![1.0],
            }],
        );
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("&lt;script&gt;"), "{svg}");
    }

    #[test]
    fn an_empty_chart_still_draws() {
        let svg = chart(&[], &[]);
        assert!(svg.contains("</svg>"));
    }
}
