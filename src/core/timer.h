/* timer.h - monotonic wall-clock seconds. */
#ifndef CKV_TIMER_H
#define CKV_TIMER_H

double ckv_time_now(void);

#endif
