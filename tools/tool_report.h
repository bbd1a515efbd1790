/* A tool's errors after MPI start-up, said once per job.
 *
 * The one idea: an error that every rank holds word for word (a verdict the
 * ranks agreed on, fsc_group_agree) is printed by the one rank that found
 * it; an error only this rank has is printed here, naming the rank. A step
 * every rank takes together (setting up, loading the data) first agrees on
 * its outcome, so a failure all ranks share is one line, not one per rank. */
#ifndef FSC_TOOLS_TOOL_REPORT_H
#define FSC_TOOLS_TOOL_REPORT_H

/* Prints "<tool>: <context><fsc_last_error()>" on the rank that should say
 * it ("<tool>: rank R: ..." for a rank's own error when there are several);
 * the other ranks print nothing and wait a moment before returning, so the
 * launcher, ending the job once a rank exits, does not end the reporter
 * before it has written. context is a printf format, "" for none. */
void tool_report(const char *tool, const char *context, ...) __attribute__((format(printf, 2, 3)));

/* Every rank's rc for a step all ranks take together, over the world:
 * FSC_OK when every rank succeeded, else the first failing rank's status and
 * message on every rank (tool_report then prints it once). When the
 * agreement itself fails (a rank never joins it), a failed rank keeps its
 * own error. A world of one returns rc. */
int tool_agree(int rc, const char *what);

#endif
