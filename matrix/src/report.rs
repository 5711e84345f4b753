//! The matrix's outputs: the table, the dispatcher's table, `{"rows": [...],
//! "dispatcher": [...]}` JSON, and the grid chart.

use std::path::Path;

use plotters::prelude::*;

use crate::cells::{Fault, Line, Row};
use crate::dispatcher::DispatchRow;
use crate::ledger::LedgerRow;

/// The table.
pub fn print_table(rows: &[Row], out: &mut impl std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<14} {:<13} {:<8} {:<14} {:>8} {:>13} {:>11} {:>12} {:>10} {:>12} {:>12} {:>7} {:>8} {:>8}  note",
        "service",
        "guard",
        "race",
        "fault",
        "requests",
        "double spends",
        "money twice",
        "points twice",
        "overdrafts",
        "refunded too",
        "stale tokens",
        "errors",
        "req/s",
        "p99 ms",
    )?;
    writeln!(out, "{}", "-".repeat(176))?;
    for row in rows {
        let note = note(row);
        if row.skipped.is_some() {
            writeln!(
                out,
                "{:<14} {:<13} {:<8} {:<14} {:>8} {:>13} {:>11} {:>12} {:>10} {:>12} {:>12} {:>7} {:>8} {:>8}  {}",
                row.service.name(),
                row.guard.name(),
                row.race.name(),
                row.fault.name(),
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                note
            )?;
            continue;
        }
        writeln!(
            out,
            "{:<14} {:<13} {:<8} {:<14} {:>8} {:>13} {:>11} {:>12} {:>10} {:>12} {:>12} {:>7} {:>8.0} {:>8.1}  {}",
            row.service.name(),
            row.guard.name(),
            row.race.name(),
            row.fault.name(),
            row.requests,
            row.double_spends,
            row.money_spent_twice,
            row.points_spent_twice,
            row.overdrafts,
            row.refunded_too_much,
            row.stale_fencing_tokens,
            row.errors,
            row.throughput,
            row.p99_ms,
            note
        )?;
    }
    Ok(())
}

/// A row's note: why it was not run, the audit's other findings, how long it went unserved.
fn note(row: &Row) -> String {
    let note = match (&row.skipped, row.other_violations) {
        (Some(why), _) if why.starts_with("failed") => why.clone(),
        (Some(why), _) => format!("n/a: {why}"),
        (None, 0) => String::new(),
        (None, other) => format!("{other} other audit findings"),
    };
    match row.unserved_ms {
        Some(ms) if note.is_empty() => {
            format!("unserved {:.1} s", ms as f64 / 1000.0)
        }
        Some(ms) => format!("{note}; unserved {:.1} s", ms as f64 / 1000.0),
        None => note,
    }
}

fn create_parent(path: &Path) -> std::io::Result<()> {
    match path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        Some(parent) => std::fs::create_dir_all(parent),
        None => Ok(()),
    }
}

/// The dispatcher's table: each key scheme under each fault, as the bank saw it.
pub fn print_dispatcher(
    rows: &[DispatchRow],
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<22} {:<17} {:>7} {:>9} {:>6} {:>7} {:>8} {:>10} {:>7} {:>9} {:>9} {:>7}  note",
        "dispatcher keys",
        "fault",
        "payouts",
        "succeeded",
        "failed",
        "pending",
        "at bank",
        "paid twice",
        "missing",
        "reversed+",
        "attempts",
        "drain s",
    )?;
    writeln!(out, "{}", "-".repeat(140))?;
    for row in rows {
        if let Some(why) = &row.skipped {
            writeln!(
                out,
                "{:<22} {:<17} {why}",
                row.keys.name(),
                row.fault.name()
            )?;
            continue;
        }
        let note = match row.other_violations {
            0 => String::new(),
            other => format!("{other} other audit findings"),
        };
        writeln!(
            out,
            "{:<22} {:<17} {:>7} {:>9} {:>6} {:>7} {:>8} {:>10} {:>7} {:>9} {:>9} {:>7.1}  {note}",
            row.keys.name(),
            row.fault.name(),
            row.payouts,
            row.succeeded,
            row.failed,
            row.pending,
            row.executed_at_bank,
            row.paid_twice,
            row.missing_at_bank,
            row.reversed_but_executed,
            row.most_attempts,
            row.drain_seconds,
        )?;
    }
    Ok(())
}

/// `{"rows": [...], "dispatcher": [...]}`.
pub fn write_json(
    rows: &[Row],
    dispatcher: &[DispatchRow],
    ledger: &[LedgerRow],
    path: &Path,
) -> std::io::Result<()> {
    create_parent(path)?;
    std::fs::write(
        path,
        serde_json::to_vec_pretty(
            &serde_json::json!({ "rows": rows, "dispatcher": dispatcher, "ledger": ledger }),
        )?,
    )
}

/// The ledger table: one line per replication × locks × fault.
pub fn print_ledger(rows: &[LedgerRow], out: &mut impl std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<12} {:<17} {:<17} {:>8} {:>9} {:>9} {:>8} {:>7} {:>10} {:>5}  note",
        "replication",
        "locks",
        "fault",
        "requests",
        "ack lost",
        "executed",
        "unknown",
        "double",
        "unserved s",
        "tries",
    )?;
    writeln!(
        out,
        "{:<12} {:<17} {:<17} {:>8} {:>9} {:>9} {:>8} {:>7} {:>10} {:>5}",
        "", "", "", "", "", "twice", "at bank", "spends", "", ""
    )?;
    writeln!(out, "{}", "-".repeat(128))?;
    for row in rows {
        if let Some(why) = &row.skipped {
            writeln!(
                out,
                "{:<12} {:<17} {:<17} {why}",
                row.replication.name(),
                row.locks.name(),
                row.fault.name()
            )?;
            continue;
        }
        let mut note = row
            .answers_5xx
            .iter()
            .map(|(answer, count)| format!("{count} × {answer}"))
            .collect::<Vec<_>>()
            .join(", ");
        if let Some((earliest, latest)) = row.lost_acknowledged_at {
            note.push_str(&format!(
                "; lost outcomes acknowledged {earliest:+.1} s to {latest:+.1} s from the fault"
            ));
        }
        if row.other_violations > 0 {
            note.push_str(&format!("; {} other audit findings", row.other_violations));
        }
        if note.is_empty() {
            note.push_str("no 5xx");
        }
        writeln!(
            out,
            "{:<12} {:<17} {:<17} {:>8} {:>9} {:>9} {:>8} {:>7} {:>10.1} {:>5}  {note}",
            row.replication.name(),
            row.locks.name(),
            row.fault.name(),
            row.requests,
            row.acknowledged_lost,
            row.executed_twice,
            row.unknown_at_bank,
            row.double_spends,
            row.unserved_seconds,
            row.tries,
        )?;
    }
    Ok(())
}

/// The chart's rows (each line, in the order first met) and columns (each fault, likewise).
fn lines_and_faults(rows: &[Row]) -> (Vec<Line>, Vec<Fault>) {
    let mut lines: Vec<Line> = Vec::new();
    let mut faults: Vec<Fault> = Vec::new();
    for row in rows {
        let line = row.line();
        if !lines.contains(&line) {
            lines.push(line);
        }
        if !faults.contains(&row.fault) {
            faults.push(row.fault);
        }
    }
    (lines, faults)
}

/// A cell's colour and text (its lines split at `|`): grey for not run, red for a double
/// spend or a payment refunded past what it paid, green for none; empty for a cell the matrix did not have.
fn cell_look(found: Option<&Row>) -> (RGBColor, String) {
    match found {
        Some(row) if row.skipped.is_some() => (RGBColor(200, 200, 200), "n/a".to_owned()),
        Some(row) if row.refunded_too_much > 0 => (
            RGBColor(220, 70, 60),
            format!("{} payments|refunded past it", row.refunded_too_much),
        ),
        Some(row) if row.spent_twice() => (
            RGBColor(220, 70, 60),
            format!(
                "{} double spends|{} money, {} pts",
                row.double_spends, row.money_spent_twice, row.points_spent_twice
            ),
        ),
        Some(row) if row.stale_fencing_tokens > 0 => (
            RGBColor(70, 160, 90),
            format!("none|{} stale tokens refused", row.stale_fencing_tokens),
        ),
        Some(_) => (RGBColor(70, 160, 90), "none".to_owned()),
        None => (RGBColor(240, 240, 240), String::new()),
    }
}

/// The matrix as a grid: one cell per row × fault, red with the count where the audit
/// found double spends, green where it found none, grey where the fault does not apply.
pub fn draw_chart(rows: &[Row], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    create_parent(path)?;
    let (lines, faults) = lines_and_faults(rows);
    let (cell_w, cell_h, left, top) = (150, 44, 250, 70);
    let width = left + cell_w * faults.len() as u32 + 20;
    let height = top + cell_h * lines.len() as u32 + 40;
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    root.draw(&Text::new(
        "Double spends and refunds past the payment found by the audit, per lock service, guard and race × fault",
        (10, 10),
        ("sans-serif", 20).into_font(),
    ))?;
    let font = ("sans-serif", 14).into_font();
    for (column, fault) in faults.iter().enumerate() {
        let x = left + column as u32 * cell_w;
        root.draw(&Text::new(
            fault.name(),
            (x as i32 + 8, top as i32 - 24),
            font.clone(),
        ))?;
    }
    for (index, line) in lines.iter().enumerate() {
        let y = top + index as u32 * cell_h;
        root.draw(&Text::new(
            format!(
                "{} {} · {}",
                line.service.name(),
                line.guard.name(),
                line.race.name()
            ),
            (10, y as i32 + 14),
            font.clone(),
        ))?;
        for (column, fault) in faults.iter().enumerate() {
            let x = left + column as u32 * cell_w;
            let found = rows
                .iter()
                .find(|row| row.line() == *line && row.fault == *fault);
            let (color, text) = cell_look(found);
            root.draw(&Rectangle::new(
                [
                    (x as i32, y as i32),
                    ((x + cell_w - 4) as i32, (y + cell_h - 4) as i32),
                ],
                color.filled(),
            ))?;
            for (part_index, part) in text.split('|').enumerate() {
                let position = (x as i32 + 6, y as i32 + 6 + 16 * part_index as i32);
                root.draw(&Text::new(
                    part.to_owned(),
                    position,
                    ("sans-serif", 12).into_font().color(&WHITE),
                ))?;
            }
        }
    }
    root.present()?;
    Ok(())
}
