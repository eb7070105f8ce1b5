/*
 * svg_plot.c — a small hand-written SVG line plot on log-log axes, for
 * `moex bench --plot`. No dependencies; the output is a self-contained SVG
 * document a browser shows as is.
 */
#include "svg_plot.h"

#include <math.h>
#include <stdio.h>

/* Canvas and plot-area geometry, in SVG user units (pixels). */
enum { CANVAS_W = 820, CANVAS_H = 540 };
enum { AREA_LEFT = 84, AREA_RIGHT = 640, AREA_TOP = 72, AREA_BOTTOM = 470 };
enum { LEGEND_X = 660, LEGEND_Y = 84, LEGEND_ROW = 22 };

static const char *const PALETTE[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
enum { PALETTE_SIZE = sizeof PALETTE / sizeof PALETTE[0], MARKER_KINDS = 5 };

/* Decade range [lo, hi] (powers of ten) of one axis. */
typedef struct axis {
    int lo, hi;
    double px_lo, px_hi; /* pixel positions of 10^lo and 10^hi */
} axis;

static int point_ok(double x, double y)
{
    return isfinite(x) && isfinite(y) && x > 0.0 && y > 0.0;
}

static void write_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* Decades covering the valid points; at least one decade wide. Returns 0 if there are no points. */
static int data_decades(const svg_plot *p, int use_y, int *lo, int *hi)
{
    double mn = INFINITY, mx = -INFINITY;
    for (int s = 0; s < p->nseries; s++) {
        const svg_series *se = &p->series[s];
        for (int i = 0; i < se->n; i++) {
            if (!point_ok(se->x[i], se->y[i]))
                continue;
            double v = use_y ? se->y[i] : se->x[i];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
    }
    if (!(mn <= mx)) {
        *lo = 0;
        *hi = 1;
        return 0;
    }
    /* A tiny tolerance keeps exact powers of ten (1, 10, 1000) on their own decade. */
    *lo = (int)floor(log10(mn) + 1e-9);
    *hi = (int)ceil(log10(mx) - 1e-9);
    if (*hi <= *lo)
        *hi = *lo + 1;
    return 1;
}

static double axis_px(const axis *a, double v)
{
    double t = (log10(v) - a->lo) / (double)(a->hi - a->lo);
    return a->px_lo + t * (a->px_hi - a->px_lo);
}

/* Label of 10^e: plain decimals for moderate exponents, "1e7" beyond. */
static void decade_label(int e, char *buf, size_t size)
{
    if (e >= 0 && e <= 5)
        snprintf(buf, size, "%.0f", pow(10.0, e));
    else if (e < 0 && e >= -4)
        snprintf(buf, size, "%.*f", -e, pow(10.0, e));
    else
        snprintf(buf, size, "1e%d", e);
}

/* Axes spanning at most this many decades also label the 2x and 5x minor ticks. */
enum { FEW_DECADES = 2 };

static int minor_labelled(const axis *a, int m)
{
    return a->hi - a->lo <= FEW_DECADES && (m == 2 || m == 5);
}

static void write_header(FILE *f, const svg_plot *p)
{
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
            CANVAS_W, CANVAS_H, CANVAS_W, CANVAS_H);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", CANVAS_W,
            CANVAS_H);
    fprintf(f, "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"17\" "
               "font-weight=\"bold\" fill=\"#222222\">",
            (AREA_LEFT + AREA_RIGHT) / 2);
    write_escaped(f, p->title);
    fputs("</text>\n", f);
    if (p->subtitle) {
        fprintf(f, "<text x=\"%d\" y=\"50\" text-anchor=\"middle\" font-size=\"12\" "
                   "fill=\"#555555\">",
                (AREA_LEFT + AREA_RIGHT) / 2);
        write_escaped(f, p->subtitle);
        fputs("</text>\n", f);
    }
}

/* Grid lines, ticks and labels of the x axis (vertical lines). */
static void write_x_axis(FILE *f, const axis *ax)
{
    char label[32];
    for (int e = ax->lo; e <= ax->hi; e++) {
        double px = axis_px(ax, pow(10.0, e));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#cccccc\"/>\n", px,
                AREA_TOP, px, AREA_BOTTOM);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333333\"/>\n", px,
                AREA_BOTTOM, px, AREA_BOTTOM + 6);
        decade_label(e, label, sizeof label);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\" "
                   "fill=\"#333333\">%s</text>\n",
                px, AREA_BOTTOM + 20, label);
        for (int m = 2; m <= 9 && e < ax->hi; m++) {
            double mx = axis_px(ax, m * pow(10.0, e));
            fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eeeeee\"/>\n",
                    mx, AREA_TOP, mx, AREA_BOTTOM);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333333\"/>\n",
                    mx, AREA_BOTTOM, mx, AREA_BOTTOM + 3);
            if (minor_labelled(ax, m))
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\" "
                           "fill=\"#777777\">%g</text>\n",
                        mx, AREA_BOTTOM + 18, m * pow(10.0, e));
        }
    }
}

/* Grid lines, ticks and labels of the y axis (horizontal lines). */
static void write_y_axis(FILE *f, const axis *ay)
{
    char label[32];
    for (int e = ay->lo; e <= ay->hi; e++) {
        double py = axis_px(ay, pow(10.0, e));
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#cccccc\"/>\n",
                AREA_LEFT, py, AREA_RIGHT, py);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#333333\"/>\n",
                AREA_LEFT - 6, py, AREA_LEFT, py);
        decade_label(e, label, sizeof label);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\" "
                   "fill=\"#333333\">%s</text>\n",
                AREA_LEFT - 9, py + 4.0, label);
        for (int m = 2; m <= 9 && e < ay->hi; m++) {
            double my = axis_px(ay, m * pow(10.0, e));
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eeeeee\"/>\n",
                    AREA_LEFT, my, AREA_RIGHT, my);
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#333333\"/>\n",
                    AREA_LEFT - 3, my, AREA_LEFT, my);
            if (minor_labelled(ay, m))
                fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"10\" "
                           "fill=\"#777777\">%g</text>\n",
                        AREA_LEFT - 7, my + 3.5, m * pow(10.0, e));
        }
    }
}

static void write_frame_and_labels(FILE *f, const svg_plot *p)
{
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#333333\"/>\n",
            AREA_LEFT, AREA_TOP, AREA_RIGHT - AREA_LEFT, AREA_BOTTOM - AREA_TOP);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" fill=\"#222222\">",
            (AREA_LEFT + AREA_RIGHT) / 2, AREA_BOTTOM + 44);
    write_escaped(f, p->x_label);
    fputs("</text>\n", f);
    int cy = (AREA_TOP + AREA_BOTTOM) / 2;
    fprintf(f, "<text x=\"24\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" fill=\"#222222\" "
               "transform=\"rotate(-90 24 %d)\">",
            cy, cy);
    write_escaped(f, p->y_label);
    fputs("</text>\n", f);
}

/*
 * Open a marker element of kind `kind` (circle, square, triangle, diamond,
 * inverted triangle) at (x, y), without its closing ">" or "/>". Returns the
 * element's name.
 */
static const char *write_marker(FILE *f, int kind, double x, double y, const char *color)
{
    const double r = 4.5;
    switch (kind % MARKER_KINDS) {
    case 0:
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"", x, y, r, color);
        break;
    case 1:
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"", x - r,
                y - r, 2 * r, 2 * r, color);
        break;
    case 2:
        fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\"", x, y - 1.3 * r,
                x + 1.2 * r, y + r, x - 1.2 * r, y + r, color);
        break;
    case 3:
        fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\"", x,
                y - 1.4 * r, x + 1.4 * r, y, x, y + 1.4 * r, x - 1.4 * r, y, color);
        break;
    default:
        fprintf(f, "<polygon points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"%s\"", x, y + 1.3 * r,
                x + 1.2 * r, y - r, x - 1.2 * r, y - r, color);
        break;
    }
    /* Outlined, lightly filled: markers at the same point stay visible. */
    fprintf(f, " fill-opacity=\"0.35\" stroke=\"%s\" stroke-width=\"1.8\"", color);
    switch (kind % MARKER_KINDS) {
    case 0: return "circle";
    case 1: return "rect";
    default: return "polygon";
    }
}

/* One series' line: polyline pieces between skipped points. */
static void write_polyline(FILE *f, const svg_series *se, const char *color, const axis *ax,
                           const axis *ay)
{
    int open = 0;
    for (int i = 0; i < se->n; i++) {
        if (!point_ok(se->x[i], se->y[i])) {
            if (open)
                fputs("\"/>\n", f);
            open = 0;
            continue;
        }
        if (!open)
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                       "stroke-linejoin=\"round\" points=\"",
                    color);
        fprintf(f, "%s%.1f,%.1f", open ? " " : "", axis_px(ax, se->x[i]), axis_px(ay, se->y[i]));
        open = 1;
    }
    if (open)
        fputs("\"/>\n", f);
}

/* One series' markers, each with a hover title "name: x, y". */
static void write_markers(FILE *f, const svg_series *se, int kind, const char *color,
                          const axis *ax, const axis *ay)
{
    for (int i = 0; i < se->n; i++) {
        if (!point_ok(se->x[i], se->y[i]))
            continue;
        const char *tag =
            write_marker(f, kind, axis_px(ax, se->x[i]), axis_px(ay, se->y[i]), color);
        fputs("><title>", f);
        write_escaped(f, se->name);
        fprintf(f, ": %g, %.4g</title></%s>\n", se->x[i], se->y[i], tag);
    }
}

static void write_legend(FILE *f, const svg_plot *p)
{
    int h = 12 + LEGEND_ROW * p->nseries;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#ffffff\" "
               "stroke=\"#bbbbbb\" rx=\"4\"/>\n",
            LEGEND_X, LEGEND_Y - 16, CANVAS_W - LEGEND_X - 12, h);
    for (int s = 0; s < p->nseries; s++) {
        const char *color = PALETTE[s % PALETTE_SIZE];
        double y = LEGEND_Y + LEGEND_ROW * s;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2\"/>\n",
                LEGEND_X + 8, y, LEGEND_X + 36, y, color);
        (void)write_marker(f, s, LEGEND_X + 22, y, color);
        fputs("/>\n", f);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"13\" fill=\"#222222\">",
                LEGEND_X + 44, y + 4.5);
        write_escaped(f, p->series[s].name);
        fputs("</text>\n", f);
    }
}

int svg_plot_write(FILE *f, const svg_plot *p)
{
    axis ax = {0, 1, AREA_LEFT, AREA_RIGHT};
    axis ay = {0, 1, AREA_BOTTOM, AREA_TOP};
    int have = data_decades(p, 0, &ax.lo, &ax.hi);
    data_decades(p, 1, &ay.lo, &ay.hi);

    write_header(f, p);
    write_x_axis(f, &ax);
    write_y_axis(f, &ay);
    write_frame_and_labels(f, p);
    if (!have)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\" "
                   "fill=\"#888888\">no data</text>\n",
                (AREA_LEFT + AREA_RIGHT) / 2, (AREA_TOP + AREA_BOTTOM) / 2);
    /* Lines first, then markers, so that no line hides a marker. */
    for (int s = 0; s < p->nseries; s++)
        write_polyline(f, &p->series[s], PALETTE[s % PALETTE_SIZE], &ax, &ay);
    for (int s = 0; s < p->nseries; s++)
        write_markers(f, &p->series[s], s, PALETTE[s % PALETTE_SIZE], &ax, &ay);
    if (p->nseries > 0)
        write_legend(f, p);
    fputs("</svg>\n", f);
    return ferror(f) ? -1 : 0;
}
