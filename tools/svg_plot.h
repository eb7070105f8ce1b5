/*
 * svg_plot.h — a log-log line plot written as a self-contained SVG document (tools/svg_plot.c).
 */
#ifndef MOEX_TOOLS_SVG_PLOT_H
#define MOEX_TOOLS_SVG_PLOT_H

#include <stdio.h>

/** One line of a plot: n points (x[i], y[i]); points with x or y <= 0 or not finite are skipped. */
typedef struct svg_series {
    const char *name;
    int n;
    const double *x;
    const double *y;
} svg_series;

/** A log-log line plot. All strings are plain text (escaped when written); subtitle may be NULL. */
typedef struct svg_plot {
    const char *title;
    const char *subtitle;
    const char *x_label;
    const char *y_label;
    int nseries;
    const svg_series *series;
} svg_plot;

/**
 * Write `plot` as a self-contained SVG document to f: log-log axes with
 * decade ticks and labels, one polyline with markers per series, a legend.
 * Returns 0, or -1 if writing failed (ferror).
 */
int svg_plot_write(FILE *f, const svg_plot *plot);

#endif /* MOEX_TOOLS_SVG_PLOT_H */
