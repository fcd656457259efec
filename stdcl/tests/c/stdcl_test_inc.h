/* Found through the default -I of the working folder. */
#define FROM_INCLUDE 4242
