/* fsc_version(): the version compiled into the library, for programs that
 * need to know which libfsc they run with rather than which headers they saw. */
#include "fsc/version.h"

const char *fsc_version(void) {
    return FSC_VERSION_STRING;
}
