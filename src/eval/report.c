/* report.c - per-(task, press, budget) means, losses against the full cache, the Markdown / JSON
 * summary and the SVG score-vs-budget plot drawn here (no plotting library). Text only, plus the
 * atomic writes of ckv_eval_report_write. */
#include "eval/report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/strbuf.h"

#define MEAN_TASK "(mean)"

static int same_group(const ckv_eval_summary *g, const char *task, int length, const char *press, double budget) {
    return g->length == length && g->budget == budget && !strcmp(g->task, task) && !strcmp(g->press, press);
}

static int cmp_summary(const void *x, const void *y) {
    const ckv_eval_summary *a = x, *b = y;
    int am = !strcmp(a->task, MEAN_TASK), bm = !strcmp(b->task, MEAN_TASK);
    if (am != bm) return am - bm;
    int c = strcmp(a->task, b->task);
    if (c) return c;
    if (a->length != b->length) return a->length < b->length ? -1 : 1;
    int an = !strcmp(a->press, "none"), bn = !strcmp(b->press, "none");
    if (an != bn) return bn - an;
    c = strcmp(a->press, b->press);
    if (c) return c;
    return a->budget < b->budget ? -1 : a->budget > b->budget;
}

ckv_status ckv_eval_summarize(const ckv_eval_result *rows, int n, ckv_eval_summary **out, int *n_out) {
    *out = NULL;
    *n_out = 0;
    int cap = 16, ng = 0;
    ckv_eval_summary *g = malloc(sizeof *g * (size_t)cap);
    if (!g) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory summarising");
    for (int i = 0; i < n; i++) {
        const ckv_eval_result *r = &rows[i];
        double budget = strcmp(r->press, "none") ? r->budget : 1.0;
        int k = 0;
        while (k < ng && !same_group(&g[k], r->task, r->length, r->press, budget)) k++;
        if (k == ng) {
            if (ng + 2 >= cap) {
                cap *= 2;
                ckv_eval_summary *b = realloc(g, sizeof *g * (size_t)cap);
                if (!b) {
                    free(g);
                    return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory summarising");
                }
                g = b;
            }
            memset(&g[ng], 0, sizeof g[ng]);
            snprintf(g[ng].task, sizeof g[ng].task, "%s", r->task);
            snprintf(g[ng].press, sizeof g[ng].press, "%s", r->press);
            g[ng].length = r->length;
            g[ng].budget = budget;
            ng++;
        }
        g[k].n++;
        g[k].score += r->score; /* the sum for now */
    }
    for (int k = 0; k < ng; k++) g[k].score = 100.0 * g[k].score / g[k].n;
    for (int k = 0; k < ng; k++)
        for (int b = 0; b < ng; b++)
            if (!strcmp(g[b].press, "none") && !strcmp(g[b].task, g[k].task) && g[b].length == g[k].length) {
                g[k].has_base = 1;
                g[k].base = g[b].score;
                g[k].loss = g[b].score - g[k].score;
            }
    /* the mean over tasks of every (press, budget), when there is more than one task */
    int n_tasks = 0;
    for (int k = 0; k < ng; k++) {
        int first = 1;
        for (int b = 0; b < k; b++) first &= !(!strcmp(g[b].task, g[k].task) && g[b].length == g[k].length);
        n_tasks += first;
    }
    int n_groups = ng;
    if (n_tasks > 1) {
        for (int k = 0; k < n_groups; k++) {
            int seen = 0;
            for (int m = n_groups; m < ng && !seen; m++) seen = same_group(&g[m], MEAN_TASK, 0, g[k].press, g[k].budget);
            if (seen) continue;
            if (ng + 1 >= cap) {
                cap *= 2;
                ckv_eval_summary *b = realloc(g, sizeof *g * (size_t)cap);
                if (!b) {
                    free(g);
                    return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory summarising");
                }
                g = b;
            }
            ckv_eval_summary m;
            memset(&m, 0, sizeof m);
            snprintf(m.task, sizeof m.task, "%s", MEAN_TASK);
            snprintf(m.press, sizeof m.press, "%s", g[k].press);
            m.budget = g[k].budget;
            int cnt = 0, all_base = 1;
            double base = 0.0;
            for (int b = 0; b < n_groups; b++)
                if (!strcmp(g[b].press, g[k].press) && g[b].budget == g[k].budget) {
                    m.score += g[b].score;
                    m.n += g[b].n;
                    all_base &= g[b].has_base;
                    base += g[b].base;
                    cnt++;
                }
            m.score /= cnt;
            if (all_base) {
                m.has_base = 1;
                m.base = base / cnt;
                m.loss = m.base - m.score;
            }
            g[ng++] = m;
        }
    }
    qsort(g, (size_t)ng, sizeof *g, cmp_summary);
    *out = g;
    *n_out = ng;
    return CKV_STATUS_OK;
}

static const char *press_label(const char *press) { return strcmp(press, "none") ? press : "full cache"; }

ckv_status ckv_eval_report_table(const ckv_eval_summary *s, int n, char **out) {
    ckv_strbuf b;
    ckv_strbuf_init(&b);
    ckv_strbuf_adds(&b, "| task | length | press | budget | n | score | full cache | loss |\n");
    ckv_strbuf_adds(&b, "|---|--:|---|--:|--:|--:|--:|--:|\n");
    for (int i = 0; i < n; i++) {
        char len[16] = "-", base[16] = "-", loss[16] = "-";
        if (s[i].length) snprintf(len, sizeof len, "%d", s[i].length);
        if (s[i].has_base) {
            snprintf(base, sizeof base, "%.1f", s[i].base);
            snprintf(loss, sizeof loss, "%.1f", s[i].loss == 0.0 ? 0.0 : s[i].loss);
        }
        ckv_strbuf_printf(&b, "| %s | %s | %s | %.2f | %d | %.1f | %s | %s |\n", s[i].task, len, press_label(s[i].press),
                          s[i].budget, s[i].n, s[i].score, base, loss);
    }
    return ckv_strbuf_take(&b, out, "the summary table");
}

static double round6(double v) { return round(v * 1e6) / 1e6; }

ckv_status ckv_eval_report_json(const ckv_eval_summary *s, int n, char **out) {
    ckv_strbuf b; /* one row a line: cJSON writes each row */
    ckv_strbuf_init(&b);
    ckv_strbuf_adds(&b, "{\"rows\": [");
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) {
            ckv_strbuf_free(&b);
            return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory writing the JSON summary");
        }
        cJSON_AddStringToObject(o, "task", s[i].task);
        cJSON_AddNumberToObject(o, "length", s[i].length);
        cJSON_AddStringToObject(o, "press", s[i].press);
        cJSON_AddNumberToObject(o, "budget", s[i].budget);
        cJSON_AddNumberToObject(o, "n", s[i].n);
        cJSON_AddNumberToObject(o, "score", round6(s[i].score));
        if (s[i].has_base) {
            cJSON_AddNumberToObject(o, "full_cache", round6(s[i].base));
            cJSON_AddNumberToObject(o, "loss", round6(s[i].loss));
        }
        char *row = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!row) {
            ckv_strbuf_free(&b);
            return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory writing the JSON summary");
        }
        ckv_strbuf_adds(&b, i ? ",\n  " : "\n  ");
        ckv_strbuf_adds(&b, row);
        cJSON_free(row);
    }
    ckv_strbuf_adds(&b, "\n]}\n");
    return ckv_strbuf_take(&b, out, "the JSON summary");
}

/* ---- the plot ------------------------------------------------------------------------------------- */

#define PANEL_W 300
#define PANEL_H 220
#define PLOT_X 48
#define PLOT_Y 34
#define PLOT_W 232
#define PLOT_H 140
#define TOP 70

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                      "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
#define N_COLORS ((int)(sizeof palette / sizeof palette[0]))

static double px(int panel_x, double budget) { return panel_x + PLOT_X + budget * PLOT_W; }
static double py(int panel_y, double score) { return panel_y + PLOT_Y + PLOT_H - score / 100.0 * PLOT_H; }

ckv_status ckv_eval_report_svg(const ckv_eval_summary *s, int n, const char *title, char **out) {
    /* panels: distinct (task, length) in order; presses: distinct non-full-cache labels */
    int *panel_of = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    int *first_row = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    const char **presses = malloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    if (!panel_of || !first_row || !presses) {
        free(panel_of);
        free(first_row);
        free(presses);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory drawing the plot");
    }
    int n_panels = 0, n_presses = 0;
    for (int i = 0; i < n; i++) {
        int p = 0;
        while (p < n_panels && !(!strcmp(s[first_row[p]].task, s[i].task) && s[first_row[p]].length == s[i].length)) p++;
        if (p == n_panels) first_row[n_panels++] = i;
        panel_of[i] = p;
        if (strcmp(s[i].press, "none")) {
            int k = 0;
            while (k < n_presses && strcmp(presses[k], s[i].press)) k++;
            if (k == n_presses) presses[n_presses++] = s[i].press;
        }
    }
    int cols = n_panels < 4 ? (n_panels ? n_panels : 1) : 4, rows = (n_panels + cols - 1) / cols;
    int W = cols * PANEL_W, H = TOP + (rows ? rows : 1) * PANEL_H;
    ckv_strbuf b;
    ckv_strbuf_init(&b);
    ckv_strbuf_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                      "font-family=\"sans-serif\">\n", W, H, W, H);
    ckv_strbuf_printf(&b, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    ckv_strbuf_adds(&b, "<text x=\"12\" y=\"22\" font-size=\"15\" font-weight=\"bold\">");
    ckv_strbuf_xml(&b, title ? title : "score vs KV budget");
    ckv_strbuf_adds(&b, "</text>\n");
    /* legend */
    double lx = 12;
    ckv_strbuf_printf(&b, "<line x1=\"%.1f\" y1=\"45\" x2=\"%.1f\" y2=\"45\" stroke=\"#444\" stroke-width=\"2\" "
                      "stroke-dasharray=\"5,4\"/><text x=\"%.1f\" y=\"49\" font-size=\"12\">full cache</text>\n", lx, lx + 22,
                      lx + 27);
    lx += 100;
    for (int k = 0; k < n_presses; k++) {
        ckv_strbuf_printf(&b, "<line x1=\"%.1f\" y1=\"45\" x2=\"%.1f\" y2=\"45\" stroke=\"%s\" stroke-width=\"2.5\"/>"
                          "<circle cx=\"%.1f\" cy=\"45\" r=\"3\" fill=\"%s\"/><text x=\"%.1f\" y=\"49\" font-size=\"12\">",
                          lx, lx + 22, palette[k % N_COLORS], lx + 11, palette[k % N_COLORS], lx + 27);
        ckv_strbuf_xml(&b, presses[k]);
        ckv_strbuf_adds(&b, "</text>\n");
        lx += 40 + 7.0 * (double)strlen(presses[k]);
    }
    for (int p = 0; p < n_panels; p++) {
        int ox = (p % cols) * PANEL_W, oy = TOP + (p / cols) * PANEL_H;
        const ckv_eval_summary *h = &s[first_row[p]];
        char head[160];
        if (h->length) snprintf(head, sizeof head, "%s @ %d tokens", h->task, h->length);
        else snprintf(head, sizeof head, "%s", strcmp(h->task, MEAN_TASK) ? h->task : "mean over tasks");
        ckv_strbuf_printf(&b, "<text x=\"%d\" y=\"%d\" font-size=\"13\" font-weight=\"bold\">", ox + PLOT_X, oy + 20);
        ckv_strbuf_xml(&b, head);
        ckv_strbuf_adds(&b, "</text>\n");
        for (int t = 0; t <= 4; t++) { /* grid, ticks */
            double y = py(oy, 25.0 * t), x = px(ox, 0.25 * t);
            ckv_strbuf_printf(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
                              "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%d</text>\n",
                              px(ox, 0), y, px(ox, 1), y, px(ox, 0) - 4, y + 3, 25 * t);
            ckv_strbuf_printf(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
                              "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%g</text>\n",
                              x, py(oy, 0), x, py(oy, 100), x, py(oy, 0) + 13, 0.25 * t);
        }
        ckv_strbuf_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n",
                          px(ox, 0), py(oy, 100), PLOT_W, PLOT_H);
        ckv_strbuf_printf(&b, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">KV budget (kept fraction)"
                          "</text>\n", px(ox, 0.5), oy + PLOT_Y + PLOT_H + 28);
        ckv_strbuf_printf(&b, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 %d "
                          "%.1f)\">score</text>\n", ox + 14, py(oy, 50), ox + 14, py(oy, 50));
        for (int i = 0; i < n; i++) /* the full cache */
            if (panel_of[i] == p && !strcmp(s[i].press, "none"))
                ckv_strbuf_printf(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" stroke-width=\"2\" "
                                  "stroke-dasharray=\"5,4\"><title>full cache: %.1f</title></line>\n",
                                  px(ox, 0), py(oy, s[i].score), px(ox, 1), py(oy, s[i].score), s[i].score);
        for (int k = 0; k < n_presses; k++) {
            const char *color = palette[k % N_COLORS];
            int pts = 0;
            ckv_strbuf_printf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2.5\" points=\"", color);
            for (int i = 0; i < n; i++) /* rows are sorted by budget within a press */
                if (panel_of[i] == p && !strcmp(s[i].press, presses[k]))
                    ckv_strbuf_printf(&b, "%s%.1f,%.1f", pts++ ? " " : "", px(ox, s[i].budget), py(oy, s[i].score));
            ckv_strbuf_adds(&b, "\"/>\n");
            for (int i = 0; i < n; i++)
                if (panel_of[i] == p && !strcmp(s[i].press, presses[k])) {
                    ckv_strbuf_printf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>", px(ox, s[i].budget),
                                      py(oy, s[i].score), color);
                    ckv_strbuf_xml(&b, s[i].press);
                    ckv_strbuf_printf(&b, " budget %g: %.1f</title></circle>\n", s[i].budget, s[i].score);
                }
        }
    }
    ckv_strbuf_adds(&b, "</svg>\n");
    free(panel_of);
    free(first_row);
    free(presses);
    return ckv_strbuf_take(&b, out, "the plot");
}

ckv_status ckv_eval_report_write(const char *dir, const ckv_eval_result *rows, int n, const char *title, char **table) {
    if (table) *table = NULL;
    ckv_eval_summary *s = NULL;
    int ns = 0;
    CKV_TRY(ckv_eval_summarize(rows, n, &s, &ns));
    char *md = NULL, *json = NULL, *svg = NULL;
    size_t pl = strlen(dir) + 32;
    char *path = malloc(pl);
    ckv_status st = path ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory writing the report");
    if (st == CKV_STATUS_OK) st = ckv_eval_report_table(s, ns, &md);
    if (st == CKV_STATUS_OK) st = ckv_eval_report_json(s, ns, &json);
    if (st == CKV_STATUS_OK) st = ckv_eval_report_svg(s, ns, title, &svg);
    if (st == CKV_STATUS_OK) {
        snprintf(path, pl, "%s/summary.md", dir);
        st = ckv_eval_write_atomic(path, md, strlen(md));
    }
    if (st == CKV_STATUS_OK) {
        snprintf(path, pl, "%s/summary.json", dir);
        st = ckv_eval_write_atomic(path, json, strlen(json));
    }
    if (st == CKV_STATUS_OK) {
        snprintf(path, pl, "%s/score_vs_budget.svg", dir);
        st = ckv_eval_write_atomic(path, svg, strlen(svg));
    }
    if (st == CKV_STATUS_OK && table) {
        *table = md;
        md = NULL;
    }
    free(md);
    free(json);
    free(svg);
    free(path);
    free(s);
    return st;
}
