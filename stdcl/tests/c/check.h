/* Shared by the STDCL test programs: one line per finding, "ok" or "FAIL", and the count. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                 \
    do {                                 \
        int ok_ = (cond) ? 1 : 0;        \
        printf(ok_ ? "ok   " : "FAIL "); \
        printf(__VA_ARGS__);             \
        printf("\n");                    \
        if (!ok_) failures++;            \
    } while (0)

#define DONE()                                  \
    do {                                        \
        printf("%d failed\n", failures);        \
        return failures != 0;                   \
    } while (0)

/* The message of the last error, never NULL (for printing). */
__attribute__((unused)) static const char* why(void) {
    const char* m = clerror();
    return m ? m : "(no message)";
}
